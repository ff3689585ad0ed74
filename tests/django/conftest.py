"""Fixtures of the Django app's tests: settings pointed at the throwaway Redis.

Every test gets a unique key prefix on the session's throwaway redis-server
(``redis_server`` from tests/conftest.py), set through pytest-django's
``settings`` fixture, which also undoes it. The conf cache is reset on both
sides, so no store outlives its test.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from celery_zsched.contrib.django import conf
from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.job import Job
from celery_zsched.store import Store


@pytest.fixture
def throwaway_url(redis_server: Any) -> str:
    """db 0 of the session's throwaway redis-server."""
    return f"redis://{redis_server.host}:{redis_server.port}/0"


@pytest.fixture(autouse=True)
def zsched_redis(settings: Any, throwaway_url: str, rclient: redis.Redis) -> Iterator[None]:
    """Point ``CELERY_ZSCHED_*`` and the ``zsched`` cache alias at the throwaway server."""
    settings.CACHES = {
        **settings.CACHES,
        "zsched": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": throwaway_url},
    }
    settings.CELERY_ZSCHED_REDIS_URL = throwaway_url
    settings.CELERY_ZSCHED_KEY_PREFIX = "{dj" + uuid.uuid4().hex[:8] + "}:"
    settings.CELERY_ZSCHED_MAX_JITTER_S = 0
    conf.reset()
    yield
    conf.reset()


@pytest.fixture
def zstore() -> Store:
    """The store the Django app uses in this test."""
    return conf.get_store()


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
