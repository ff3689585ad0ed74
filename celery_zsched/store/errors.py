"""Redis failures as the package's errors: the one translation of "not now"."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import redis

from celery_zsched.core.errors import StoreUnavailable

#: Errors that mean "not now": the server is down, loading, failing over, or
#: (Cluster) its slots are moving. Nothing was applied; the call can be retried.
_UNAVAILABLE = (
    redis.ConnectionError, redis.TimeoutError, redis.exceptions.ReadOnlyError,
    redis.exceptions.MasterDownError, redis.exceptions.ClusterError,
    redis.exceptions.RedisClusterException, redis.exceptions.TryAgainError,
)
#: Error codes redis-py has no class for that mean the same: a master that may
#: not write now (``min-replicas-to-write`` unmet). A script fails on its first
#: write with it, before anything is applied.
_NOT_NOW_CODES = ("NOREPLICAS",)


@contextlib.contextmanager
def redis_unavailable() -> Iterator[None]:
    """Turn Redis connection failures into :class:`StoreUnavailable` (the one translation)."""
    try:
        yield
    except _UNAVAILABLE as exc:
        raise StoreUnavailable(f"Redis unreachable: {exc}") from exc
    except redis.ResponseError as exc:
        if str(exc).startswith(_NOT_NOW_CODES):
            raise StoreUnavailable(f"Redis refuses writes for now: {exc}") from exc
        raise
