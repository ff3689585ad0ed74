"""Where the schedule lives: the Redis connection and the store's layout.

The URL forms of ``zsched_redis_url``:

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

The clients themselves are built in :mod:`celery_zsched.store.connection`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from celery_zsched.config.load import SETTING_PREFIX, check_positive
from celery_zsched.core.errors import ConfigurationError

#: The key prefix when none is set (a Redis Cluster hash tag: one slot).
DEFAULT_PREFIX = "{zsched}:"
#: Where the schedule lives when neither zsched_redis_url nor a Redis broker says.
DEFAULT_REDIS_URL = "redis://localhost:6379/0"
SENTINEL_SCHEME = "sentinel"
SENTINEL_PORT = 26379
#: Values of ``zsched_redis_ssl_cert_reqs`` (redis-py's names).
CERT_REQS = ("none", "optional", "required")
#: TLS settings (without prefix) that name files, and their redis-py keywords.
SSL_FILES = {"redis_ssl_ca_certs": "ssl_ca_certs", "redis_ssl_certfile": "ssl_certfile",
             "redis_ssl_keyfile": "ssl_keyfile"}


@dataclass(frozen=True)
class RedisSettings:
    """The Redis holding the schedule, how to reach it, and how the store is laid out."""

    #: Redis holding the schedule. Empty: the broker URL when it is Redis,
    #: else ``redis://localhost:6379/0``.
    redis_url: str = ""
    #: Prefix of every key; a Redis Cluster hash tag is added when missing.
    key_prefix: str = DEFAULT_PREFIX
    #: ``redis_url`` names a node of a Redis Cluster: use redis-py's cluster client.
    redis_cluster: bool = False
    #: Master name of a ``sentinel://`` ``redis_url`` (required with one).
    sentinel_master: str = ""
    #: Username on the Sentinels themselves (the URL's credentials are the master's).
    sentinel_username: str = ""
    #: Password on the Sentinels themselves (``requirepass`` in sentinel.conf).
    sentinel_password: str = ""
    #: Use TLS: implied by ``rediss://``; for ``sentinel://`` URLs, TLS to the
    #: Sentinels and to the master.
    redis_ssl: bool = False
    #: CA bundle (PEM) that verifies the server's certificate.
    redis_ssl_ca_certs: str = ""
    #: Client certificate (PEM), for servers with ``tls-auth-clients yes``.
    redis_ssl_certfile: str = ""
    #: Private key of the client certificate (PEM).
    redis_ssl_keyfile: str = ""
    #: Server certificate check: ``required`` (redis-py's default when empty),
    #: ``optional`` or ``none``.
    redis_ssl_cert_reqs: str = ""
    #: Partitions of the store, each under its own hash tag (its own Cluster
    #: slot). Change it on a live store only with ``zsched repartition``.
    partitions: int = 1

    def check_connection(self) -> None:
        """Raise :class:`ConfigurationError` naming the setting of a bad connection
        combination; an empty ``redis_url`` (a broker fallback fills it later)
        checks the TLS settings only."""
        check_positive(self, "partitions")
        _check_tls_files(self)
        url = self.redis_url.strip()
        if not url:
            return
        if is_sentinel_url(url):
            parse_sentinel_url(url)
            if not self.sentinel_master:
                raise ConfigurationError(
                    f"{SETTING_PREFIX}sentinel_master is required with a sentinel:// "
                    f"{SETTING_PREFIX}redis_url: the name of the master the Sentinels monitor")
            if self.redis_cluster:
                raise ConfigurationError(
                    f"{SETTING_PREFIX}redis_cluster cannot be combined with a sentinel:// "
                    f"{SETTING_PREFIX}redis_url")
            return
        _check_url_query(url)
        for name in ("sentinel_master", "sentinel_username", "sentinel_password"):
            if getattr(self, name):
                raise ConfigurationError(
                    f"{SETTING_PREFIX}{name} is set but {SETTING_PREFIX}redis_url is not a "
                    f"sentinel:// URL (got {url.split('://')[0]}://...)")
        if url.lower().startswith("unix://") and self.redis_ssl:
            raise ConfigurationError(
                f"{SETTING_PREFIX}redis_ssl: TLS over a unix:// socket is not supported")
        given = [n for n in (*SSL_FILES, "redis_ssl_cert_reqs") if getattr(self, n)]
        if given and not uses_tls(self):
            raise ConfigurationError(
                f"{SETTING_PREFIX}{given[0]} is set but the connection does not use TLS: "
                f"use a rediss:// {SETTING_PREFIX}redis_url (or {SETTING_PREFIX}redis_ssl = True)")


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


def uses_tls(settings: RedisSettings) -> bool:
    """Whether the connections of ``settings`` use TLS."""
    return settings.redis_ssl or settings.redis_url.strip().lower().startswith("rediss://")


def _check_tls_files(settings: RedisSettings) -> None:
    for name in SSL_FILES:
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
    for keyword in SSL_FILES.values():
        path = query.get(keyword)
        if path and not os.path.isfile(path):
            raise ConfigurationError(
                f"{SETTING_PREFIX}redis_url: {keyword}: no such file: {path!r}")
    if query.get("ssl_cert_reqs", "required").lower() not in CERT_REQS:
        raise ConfigurationError(
            f"{SETTING_PREFIX}redis_url: ssl_cert_reqs must be one of {', '.join(CERT_REQS)}; "
            f"got {query['ssl_cert_reqs']!r}")
