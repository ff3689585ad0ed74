"""Fixtures of the browser and example-project tests: Django pointed at the throwaway Redis.

The same arrangement as tests/django/conftest.py (whose fixtures apply only
under tests/django): a unique key prefix on the session's throwaway
redis-server, set through pytest-django's ``settings`` fixture, which undoes it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_zsched.contrib.django import conf
from celery_zsched.store import Store

#: Screenshots and logs a person can look at after the run (gitignored).
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@pytest.fixture
def throwaway_url(redis_server: Any) -> str:
    """db 0 of the session's throwaway redis-server."""
    return f"redis://{redis_server.host}:{redis_server.port}/0"


@pytest.fixture
def zsched_redis(settings: Any, throwaway_url: str) -> Iterator[None]:
    """Point ``CELERY_ZSCHED_*`` at the throwaway server, under a prefix of this test's own."""
    settings.CELERY_ZSCHED_REDIS_URL = throwaway_url
    settings.CELERY_ZSCHED_KEY_PREFIX = "{br" + uuid.uuid4().hex[:8] + "}:"
    settings.CELERY_ZSCHED_MAX_JITTER_S = 0
    conf.reset()
    yield
    conf.reset()


@pytest.fixture
def zstore(zsched_redis: None) -> Store:
    """The store the Django app uses in this test."""
    return conf.get_store()


@pytest.fixture
def artifacts() -> Path:
    """``artifacts/`` at the repository root, created on demand."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
