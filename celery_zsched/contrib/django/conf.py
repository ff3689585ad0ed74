"""Settings and the Redis store of the Django app, read lazily from Django settings.

Every ``CELERY_ZSCHED_*`` Django setting is the ``zsched_*`` Celery setting of
the same name (the ``namespace="CELERY"`` convention), so beat, workers and
Django read one configuration. Two more are Django-only:

``CELERY_ZSCHED_REDIS_ALIAS``
    A django-redis cache alias whose connection settings the store reuses
    (with ``decode_responses=True``, so on a pool of its own). Beat and
    workers do not read Django caches: give them the same server with
    ``CELERY_ZSCHED_REDIS_URL`` (system check ``zsched.W001`` reminds you).
``TIME_ZONE``
    The default zone of cron jobs and of naive times.

Nothing is read at import time; :func:`reset` drops the cached values (it runs
by itself when a test changes a relevant setting).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import redis
from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from celery_zsched.config import Settings
from celery_zsched.core.errors import ConfigurationError
from celery_zsched.core.job import Defaults
from celery_zsched.store import Store
from celery_zsched.store.connection import redis_client

DJANGO_PREFIX = "CELERY_"
ALIAS_SETTING = "CELERY_ZSCHED_REDIS_ALIAS"

_lock = threading.RLock()
_cache: dict[str, Any] = {}


def zsched_mapping() -> dict[str, Any]:
    """The ``CELERY_ZSCHED_*`` Django settings as lowercase ``zsched_*`` keys."""
    out: dict[str, Any] = {}
    for name in dir(django_settings):
        if name.startswith(DJANGO_PREFIX + "ZSCHED_"):
            out[name[len(DJANGO_PREFIX):].lower()] = getattr(django_settings, name)
    return out


def redis_alias() -> str | None:
    """The django-redis cache alias to connect through, if one is configured."""
    alias = getattr(django_settings, ALIAS_SETTING, None)
    return str(alias) if alias else None


#: The least value of each Django-only setting, and whether it may equal it.
_MINIMUM: dict[str, tuple[float, bool]] = {
    "history_days": (0, True), "outbox_interval_s": (0, False),
    "outbox_backoff_max_s": (0, False), "outbox_max_attempts": (1, True),
    "outbox_warn_s": (0, False),
}


@dataclass(frozen=True)
class DjangoSettings:
    """Settings only the Django app reads (beat accepts them and leaves them alone).

    Each is ``CELERY_ZSCHED_<NAME>`` in Django settings, overridden by the
    environment variable ``ZSCHED_<NAME>``.
    """

    #: Days of run history ``zsched_drain`` keeps; 0 keeps it forever.
    history_days: int = 30
    #: Seconds between two sweeps of the outbox (:mod:`.outbox`) by the sweeper
    #: that runs in beat: how soon a change that missed Redis is tried again.
    outbox_interval_s: float = 1.0
    #: While Redis is unreachable the sweeper waits ``outbox_interval_s``, then
    #: twice that, and so on up to this: a change reaches Redis at most about
    #: this long after Redis is back.
    outbox_backoff_max_s: float = 2.0
    #: Failed pushes of one change (Redis refused it, or its row is invalid;
    #: Redis being unreachable never counts) before it is dead-lettered.
    outbox_max_attempts: int = 10
    #: Seconds the oldest pending change may wait before ``zsched_stats`` and the
    #: dashboard warn.
    outbox_warn_s: float = 60.0

    @classmethod
    def from_django(cls, env: Mapping[str, str] | None = None) -> DjangoSettings:
        """Read and validate; raises :class:`ConfigurationError` naming the setting."""
        env = os.environ if env is None else env
        mapping = zsched_mapping()
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw: Any = mapping.get(f"zsched_{f.name}", f.default)
            source = f"zsched_{f.name}"
            if f"ZSCHED_{f.name.upper()}" in env:
                raw, source = env[f"ZSCHED_{f.name.upper()}"], f"ZSCHED_{f.name.upper()}"
            values[f.name] = _number(raw, type(f.default), source, *_MINIMUM[f.name])
        return cls(**values)


def _number(raw: Any, kind: type[Any], source: str, least: float, inclusive: bool) -> Any:
    value: int | float | None
    try:
        value = None if isinstance(raw, bool) or (kind is int and isinstance(raw, float)) \
            else kind(raw)
    except (TypeError, ValueError):
        value = None
    if value is None or not math.isfinite(value) or value < least \
            or (value == least and not inclusive):
        words = "an int" if kind is int else "a number"
        raise ConfigurationError(f"{source} must be {words} {'>=' if inclusive else '>'} "
                                 f"{least:g}, got {raw!r}")
    return value


def get_django_settings() -> DjangoSettings:
    """The Django-only settings of this project (cached like :func:`get_settings`)."""
    with _lock:
        if "django_settings" not in _cache:
            _cache["django_settings"] = DjangoSettings.from_django()
        result: DjangoSettings = _cache["django_settings"]
        return result


def time_zone() -> str:
    """Default zone of jobs: Django's ``TIME_ZONE`` (``UTC`` when unset)."""
    return str(getattr(django_settings, "TIME_ZONE", None) or "UTC")


def get_settings() -> Settings:
    """The :class:`~celery_zsched.config.Settings` of this project (cached).

    Without ``CELERY_ZSCHED_REDIS_URL`` the URL falls back, as in beat, to
    ``CELERY_BROKER_URL`` when that is Redis, else ``redis://localhost:6379/0``
    (ignored when an alias is configured). Raises
    :class:`~celery_zsched.core.errors.ConfigurationError` for unknown or bad values.
    """
    with _lock:
        if "settings" not in _cache:
            _cache["settings"] = Settings.from_mapping(zsched_mapping()).with_broker_fallback(
                getattr(django_settings, "CELERY_BROKER_URL", None),
                getattr(django_settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None),
                getattr(django_settings, "CELERY_BROKER_USE_SSL", None))
        result: Settings = _cache["settings"]
        return result


def get_defaults() -> Defaults:
    """What definitions inherit: default task and interval, and ``TIME_ZONE``."""
    return Defaults.from_settings(get_settings(), time_zone())


def get_client() -> redis.Redis:
    """A decoded Redis client, from the cache alias if configured, else the URL (cached)."""
    with _lock:
        if "client" not in _cache:
            alias = redis_alias()
            if alias:
                _cache["client"] = client_for_alias(alias)
            else:
                # Plain, Cluster or Sentinel, with TLS: as beat and the workers connect.
                _cache["client"] = redis_client(get_settings())
        client: redis.Redis = _cache["client"]
        return client


def get_store() -> Store:
    """The :class:`~celery_zsched.store.Store` of this project (cached; connects on use)."""
    with _lock:
        if "store" not in _cache:
            _cache["store"] = Store(get_client(), get_settings(), time_zone())
        store: Store = _cache["store"]
        return store


def client_for_alias(alias: str) -> redis.Redis:
    """A client with the connection settings of django-redis cache ``alias``.

    The cache's own pool returns bytes; the store needs ``decode_responses=True``,
    so this builds a pool of its own through the alias's connection factory,
    which keeps its password, TLS, timeouts, pool class (e.g. Sentinel) and
    client class. Raises :class:`ConfigurationError` when the alias is not a
    django-redis cache.
    """
    from django.core.cache import InvalidCacheBackendError, caches

    try:
        cache = caches[alias]
    except InvalidCacheBackendError as exc:
        raise ConfigurationError(f"{ALIAS_SETTING}: no cache named {alias!r}") from exc
    factory = getattr(getattr(cache, "client", None), "connection_factory", None)
    if factory is None or not hasattr(factory, "make_connection_params"):
        raise ConfigurationError(
            f"{ALIAS_SETTING}: cache {alias!r} is not a django-redis cache "
            f"({type(cache).__module__}.{type(cache).__name__})")
    params = dict(factory.make_connection_params(first_location(alias)))
    params["decode_responses"] = True
    pool = factory.get_connection_pool(params)
    client: redis.Redis = factory.redis_client_cls(
        connection_pool=pool, **factory.redis_client_cls_kwargs)
    return client


def first_location(alias: str) -> str:
    """The primary (write) server of a cache alias' ``LOCATION``."""
    location: Any = django_settings.CACHES[alias].get("LOCATION", "")
    if isinstance(location, list | tuple):
        location = location[0] if location else ""
    first = str(location).split(",")[0].strip()
    if not first:
        raise ConfigurationError(f"{ALIAS_SETTING}: cache {alias!r} has no LOCATION")
    return first


def reset() -> None:
    """Forget the cached settings, client and store (tests, or after a fork)."""
    with _lock:
        client = _cache.pop("client", None)
        _cache.clear()
    if client is not None:
        client.close()
        # A client built on an explicit pool leaves the pool open on close();
        # a Redis Cluster client has one pool per node, which close() ends.
        pool = getattr(client, "connection_pool", None)
        if pool is not None:
            pool.disconnect()


_RELEVANT = ("CACHES", "TIME_ZONE", "USE_TZ")


@receiver(setting_changed)
def _setting_changed(setting: str, **kwargs: Any) -> None:
    # override_settings / pytest-django's ``settings`` fixture send this.
    if setting.startswith(DJANGO_PREFIX) or setting in _RELEVANT:
        reset()
