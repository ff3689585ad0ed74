"""Shared fixtures. Every test talks to a throwaway redis-server this session starts.

The developer's Redis on 6379 is never touched, let alone flushed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from pytest_redis import factories

from celery_zsched.config import Settings
from celery_zsched.store import Store

# port=None: a random free port, so parallel runs (xdist, tox) never collide.
redis_server = factories.redis_proc(port=None)
redis_db = factories.redisdb("redis_server", decode=True)


@pytest.fixture
def redis_url(redis_server: Any) -> str:
    """URL of db 0 on the throwaway server."""
    return f"redis://{redis_server.host}:{redis_server.port}/0"


@pytest.fixture
def rclient(redis_db: redis.Redis) -> redis.Redis:
    """A decoded client on the throwaway server (flushed after each test)."""
    return redis_db


@pytest.fixture
def make_settings(redis_url: str) -> Callable[..., Settings]:
    """Settings on the throwaway server with a unique key prefix per call."""
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "redis_url": redis_url,
            "key_prefix": "{t" + uuid.uuid4().hex[:8] + "}:",
        }
        values.update(overrides)
        return Settings(**values)
    return make


@pytest.fixture
def make_store(rclient: redis.Redis, make_settings: Callable[..., Settings]
               ) -> Iterator[Callable[..., Store]]:
    """Build a :class:`Store` with setting overrides (``timezone=`` sets the default zone)."""
    def make(timezone: str = "UTC", **overrides: Any) -> Store:
        return Store(rclient, make_settings(**overrides), timezone)
    yield make


@pytest.fixture
def store(make_store: Callable[..., Store]) -> Store:
    """A store with default settings on the throwaway server."""
    return make_store()


@pytest.fixture
def zsched_redis(settings: Any, redis_url: str, rclient: redis.Redis) -> Iterator[None]:
    """Point Django's ``CELERY_ZSCHED_*`` and ``zsched`` cache alias at the throwaway server.

    Each test gets a key prefix of its own, set through pytest-django's
    ``settings`` fixture (which undoes it); the conf cache is reset on both
    sides, so no store outlives its test. Used by tests/django (for every
    test) and tests/browser.
    """
    from celery_zsched.contrib.django import conf  # Django is configured by now

    settings.CACHES = {
        **settings.CACHES,
        "zsched": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url},
    }
    settings.CELERY_ZSCHED_REDIS_URL = redis_url
    settings.CELERY_ZSCHED_KEY_PREFIX = "{dj" + uuid.uuid4().hex[:8] + "}:"
    settings.CELERY_ZSCHED_MAX_JITTER_S = 0
    conf.reset()
    yield
    conf.reset()


@pytest.fixture
def zstore(zsched_redis: None) -> Store:
    """The store the Django app uses in this test."""
    from celery_zsched.contrib.django import conf

    return conf.get_store()
