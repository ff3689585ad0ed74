"""Fixtures of the Django app's tests: settings pointed at the throwaway Redis.

Every test gets a unique key prefix on the session's throwaway redis-server,
through the ``zsched_redis`` fixture of tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.core.job import Job


@pytest.fixture(autouse=True)
def _store_for_every_test(zsched_redis: None) -> None:
    """Every Django test runs against its own store (``zsched_redis`` in tests/conftest.py)."""


@pytest.fixture
def make_row() -> Callable[..., ZSchedJob]:
    """Save a :class:`ZSchedJob` for a URL (``n`` picks a distinct one) with field overrides."""
    def make(n: int = 0, **fields: Any) -> ZSchedJob:
        values: dict[str, Any] = {"url": f"http://127.0.0.1:1/page/{n}", "interval_s": 60.0}
        values.update(fields)
        row = ZSchedJob(**values)
        row.full_clean()
        row.save()
        return row
    return make


@pytest.fixture
def make_job() -> Callable[..., Job]:
    """A core job for URL number ``n`` with field overrides."""
    def make(n: int = 0, **fields: Any) -> Job:
        data: dict[str, Any] = {"url": f"http://127.0.0.1:1/page/{n}", "interval_s": 60}
        data.update(fields)
        return Job.from_dict(data)
    return make
