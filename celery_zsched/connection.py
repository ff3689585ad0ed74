"""The one place that turns settings into a Redis client: plain, Cluster or Sentinel, with TLS.

URL forms of ``zsched_redis_url``:

* ``redis://[user:password@]host:port/db`` and ``unix://...``: one server;
* ``rediss://...``: one server over TLS (CA, certificate and key from the
  ``zsched_redis_ssl_*`` settings, or from the URL query as redis-py reads it,
  ``?ssl_ca_certs=/ca.pem&ssl_cert_reqs=required``; the URL wins);
* the same with ``zsched_redis_cluster``: any node of a Redis Cluster;
* ``sentinel://[user:password@]host:26379[/db];sentinel://host2:26379``
  (kombu's form) with ``zsched_sentinel_master``: the master that the
  Sentinels name, re-discovered after a failover. The URL's credentials and
  database are the master's (as in kombu); ``zsched_sentinel_username`` /
  ``zsched_sentinel_password`` authenticate on the Sentinels themselves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

from .config import SETTING_PREFIX, Settings
from .errors import ConfigurationError, redis_unavailable

#: Timeouts every client gets: a dead server is noticed in seconds, and a slow
#: Lua call (a large import chunk) still has room.
_TIMEOUTS: dict[str, Any] = {"socket_connect_timeout": 5, "socket_timeout": 30}
#: Timeouts of the connections to the Sentinels: they answer small questions.
_SENTINEL_TIMEOUTS: dict[str, Any] = {"socket_connect_timeout": 5, "socket_timeout": 5}
SENTINEL_SCHEME = "sentinel"
SENTINEL_PORT = 26379
#: Values of ``zsched_redis_ssl_cert_reqs`` (redis-py's names).
CERT_REQS = ("none", "optional", "required")
#: TLS settings (without prefix) that name files, and their redis-py keywords.
_SSL_FILES = {"redis_ssl_ca_certs": "ssl_ca_certs", "redis_ssl_certfile": "ssl_certfile",
              "redis_ssl_keyfile": "ssl_keyfile"}


@dataclass(frozen=True)
class SentinelURL:
    """A parsed ``sentinel://h1:p1;sentinel://h2:p2`` URL."""

    #: (host, port) of each Sentinel, in the URL's order.
    sentinels: tuple[tuple[str, int], ...]
    #: The master's credentials and database (the first part that gives them).
    username: str | None
    password: str | None
    db: int


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` is kombu's ``sentinel://`` form."""
    return url.strip().lower().startswith(SENTINEL_SCHEME + "://")


def parse_sentinel_url(url: str) -> SentinelURL:
    """Parse kombu's ``sentinel://[user:pw@]host:port[/db];sentinel://...`` form.

    Raises :class:`ConfigurationError` naming ``zsched_redis_url`` when a part
    is not a ``sentinel://host[:port][/db]`` URL.
    """
    setting = SETTING_PREFIX + "redis_url"
    sentinels: list[tuple[str, int]] = []
    username: str | None = None
    password: str | None = None
    db: int | None = None
    for part in filter(None, (p.strip() for p in url.split(";"))):
        try:
            parts = urlsplit(part)
            port = parts.port or SENTINEL_PORT
        except ValueError as exc:
            raise ConfigurationError(f"{setting}: bad sentinel URL part {part!r}: {exc}") from exc
        if parts.scheme.lower() != SENTINEL_SCHEME or not parts.hostname:
            raise ConfigurationError(
                f"{setting}: {part!r} is not a sentinel://host:port URL (every part of a "
                "Sentinel URL, separated by ';', must be one)")
        if parts.query:
            raise ConfigurationError(
                f"{setting}: a sentinel:// URL takes no query ({part!r}); use the "
                f"{SETTING_PREFIX}redis_ssl* and {SETTING_PREFIX}sentinel_* settings")
        sentinels.append((parts.hostname, port))
        if username is None and parts.username:
            username = unquote(parts.username)
        if password is None and parts.password is not None:
            password = unquote(parts.password)
        path = parts.path.strip("/")
        if db is None and path:
            try:
                db = int(path)
            except ValueError as exc:
                raise ConfigurationError(
                    f"{setting}: database {path!r} of {part!r} is not a number") from exc
    if not sentinels:
        raise ConfigurationError(f"{setting}: no Sentinel in {url!r}")
    return SentinelURL(tuple(sentinels), username, password, db or 0)


def uses_tls(settings: Settings) -> bool:
    """Whether the connections of ``settings`` use TLS."""
    return settings.redis_ssl or settings.redis_url.strip().lower().startswith("rediss://")


def check_settings(settings: Settings) -> None:
    """Raise :class:`ConfigurationError` naming the setting of a bad connection combination.

    Called by :meth:`Settings.validate`; an empty ``redis_url`` (the broker
    fallback fills it later) checks the TLS settings only.
    """
    _check_tls_files(settings)
    url = settings.redis_url.strip()
    if not url:
        return
    if is_sentinel_url(url):
        parse_sentinel_url(url)
        if not settings.sentinel_master:
            raise ConfigurationError(
                f"{SETTING_PREFIX}sentinel_master is required with a sentinel:// "
                f"{SETTING_PREFIX}redis_url: the name of the master the Sentinels monitor")
        if settings.redis_cluster:
            raise ConfigurationError(
                f"{SETTING_PREFIX}redis_cluster cannot be combined with a sentinel:// "
                f"{SETTING_PREFIX}redis_url")
        return
    _check_url_query(url)
    for name in ("sentinel_master", "sentinel_username", "sentinel_password"):
        if getattr(settings, name):
            raise ConfigurationError(
                f"{SETTING_PREFIX}{name} is set but {SETTING_PREFIX}redis_url is not a "
                f"sentinel:// URL (got {url.split('://')[0]}://...)")
    if url.lower().startswith("unix://") and settings.redis_ssl:
        raise ConfigurationError(
            f"{SETTING_PREFIX}redis_ssl: TLS over a unix:// socket is not supported")
    given = [n for n in (*_SSL_FILES, "redis_ssl_cert_reqs") if getattr(settings, n)]
    if given and not uses_tls(settings):
        raise ConfigurationError(
            f"{SETTING_PREFIX}{given[0]} is set but the connection does not use TLS: "
            f"use a rediss:// {SETTING_PREFIX}redis_url (or {SETTING_PREFIX}redis_ssl = True)")


def _check_tls_files(settings: Settings) -> None:
    for name in _SSL_FILES:
        path = getattr(settings, name)
        if path and not os.path.isfile(path):
            raise ConfigurationError(f"{SETTING_PREFIX}{name}: no such file: {path!r}")
    reqs = settings.redis_ssl_cert_reqs
    if reqs and reqs.strip().lower() not in CERT_REQS:
        raise ConfigurationError(
            f"{SETTING_PREFIX}redis_ssl_cert_reqs must be one of {', '.join(CERT_REQS)}; "
            f"got {reqs!r}")
    if settings.redis_ssl_keyfile and not settings.redis_ssl_certfile:
        raise ConfigurationError(
            f"{SETTING_PREFIX}redis_ssl_keyfile needs {SETTING_PREFIX}redis_ssl_certfile")


def _check_url_query(url: str) -> None:
    """The TLS options redis-py reads from the URL's query (they win over the settings)."""
    query = dict(parse_qsl(urlsplit(url).query))
    for keyword in _SSL_FILES.values():
        path = query.get(keyword)
        if path and not os.path.isfile(path):
            raise ConfigurationError(
                f"{SETTING_PREFIX}redis_url: {keyword}: no such file: {path!r}")
    if query.get("ssl_cert_reqs", "required").lower() not in CERT_REQS:
        raise ConfigurationError(
            f"{SETTING_PREFIX}redis_url: ssl_cert_reqs must be one of {', '.join(CERT_REQS)}; "
            f"got {query['ssl_cert_reqs']!r}")


def ssl_kwargs(settings: Settings) -> dict[str, Any]:
    """redis-py's TLS keywords from the ``zsched_redis_ssl_*`` settings (empty ones left out)."""
    kwargs: dict[str, Any] = {
        keyword: getattr(settings, name)
        for name, keyword in _SSL_FILES.items() if getattr(settings, name)}
    if settings.redis_ssl_cert_reqs:
        kwargs["ssl_cert_reqs"] = settings.redis_ssl_cert_reqs.strip().lower()
    return kwargs


def _tls_url(settings: Settings) -> str:
    url = settings.redis_url
    if settings.redis_ssl and url.lower().startswith("redis://"):
        return "rediss://" + url[len("redis://"):]
    return url


def redis_client(settings: Settings) -> Any:
    """A client for ``settings.redis_url``; connects lazily where the client allows.

    With ``zsched_redis_cluster`` the URL names any node of a Redis Cluster, and
    the client is redis-py's :class:`~redis.cluster.RedisCluster`, which follows
    slots and failovers by itself. With a ``sentinel://`` URL it is the master
    of ``zsched_sentinel_master``, looked up through the Sentinels again after
    every connection loss, so a failover only costs the retries of
    :class:`~celery_zsched.errors.StoreUnavailable`.
    """
    check_settings(settings)
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


def sentinel_client(settings: Settings, tls: dict[str, Any] | None = None) -> redis.Redis:
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
