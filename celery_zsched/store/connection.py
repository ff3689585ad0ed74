"""The one place that turns settings into a Redis client: plain, Cluster or Sentinel, with TLS.

The settings and their URL forms are checked in :mod:`celery_zsched.config.redis`.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

from celery_zsched.config.redis import (
    SSL_FILES,
    RedisSettings,
    is_sentinel_url,
    parse_sentinel_url,
    uses_tls,
)
from celery_zsched.store.errors import redis_unavailable

#: Timeouts every client gets: a dead server is noticed in seconds, and a slow
#: Lua call (a large import chunk) still has room.
_TIMEOUTS: dict[str, Any] = {"socket_connect_timeout": 5, "socket_timeout": 30}
#: Timeouts of the connections to the Sentinels: they answer small questions.
_SENTINEL_TIMEOUTS: dict[str, Any] = {"socket_connect_timeout": 5, "socket_timeout": 5}


def ssl_kwargs(settings: RedisSettings) -> dict[str, Any]:
    """redis-py's TLS keywords from the ``zsched_redis_ssl_*`` settings (empty ones left out)."""
    kwargs: dict[str, Any] = {
        keyword: getattr(settings, name)
        for name, keyword in SSL_FILES.items() if getattr(settings, name)}
    if settings.redis_ssl_cert_reqs:
        kwargs["ssl_cert_reqs"] = settings.redis_ssl_cert_reqs.strip().lower()
    return kwargs


def _tls_url(settings: RedisSettings) -> str:
    url = settings.redis_url
    if settings.redis_ssl and url.lower().startswith("redis://"):
        return "rediss://" + url[len("redis://"):]
    return url


def redis_client(settings: RedisSettings) -> Any:
    """A client for ``settings.redis_url``; connects lazily where the client allows.

    With ``zsched_redis_cluster`` the URL names any node of a Redis Cluster, and
    the client is redis-py's :class:`~redis.cluster.RedisCluster`, which follows
    slots and failovers by itself. With a ``sentinel://`` URL it is the master
    of ``zsched_sentinel_master``, looked up through the Sentinels again after
    every connection loss, so a failover only costs the retries of
    :class:`~celery_zsched.core.errors.StoreUnavailable`.
    """
    settings.check_connection()
    tls = ssl_kwargs(settings) if uses_tls(settings) else {}
    if is_sentinel_url(settings.redis_url):
        return sentinel_client(settings, tls)
    url = _tls_url(settings)
    if settings.redis_cluster:
        # The cluster client asks its node for the slot map right away: a node
        # that is down then is an outage to wait out, like any later one.
        with redis_unavailable():
            return RedisCluster.from_url(url, decode_responses=True, **_TIMEOUTS, **tls)
    return redis.Redis.from_url(url, decode_responses=True, health_check_interval=30,
                                **_TIMEOUTS, **tls)


def sentinel_client(settings: RedisSettings, tls: dict[str, Any] | None = None) -> redis.Redis:
    """The master of ``zsched_sentinel_master``, through the Sentinels of ``redis_url``."""
    parsed = parse_sentinel_url(settings.redis_url)
    tls = dict(tls or {})
    if tls or settings.redis_ssl:
        tls["ssl"] = True
    on_sentinels: dict[str, Any] = {**_SENTINEL_TIMEOUTS, **tls}
    if settings.sentinel_username:
        on_sentinels["username"] = settings.sentinel_username
    if settings.sentinel_password:
        on_sentinels["password"] = settings.sentinel_password
    manager = Sentinel(  # type: ignore[no-untyped-call]
        list(parsed.sentinels), sentinel_kwargs=on_sentinels)
    client: redis.Redis = manager.master_for(  # type: ignore[no-untyped-call]
        settings.sentinel_master, decode_responses=True, health_check_interval=30,
        username=parsed.username, password=parsed.password, db=parsed.db,
        **_TIMEOUTS, **tls)
    return client


def is_cluster(client: Any) -> bool:
    """Whether ``client`` talks to a Redis Cluster (pipelines then split by slot)."""
    return isinstance(client, RedisCluster)
