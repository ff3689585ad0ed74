"""Settings: lowercase ``zsched_*`` Celery settings, each with a ``ZSCHED_*`` env override.

:class:`Settings` is every setting, flat, as users write them; each section is
one concern's class, with its own checks, and a part of the package that needs
only one section takes only that one:

* :class:`~celery_zsched.config.redis.RedisSettings`: where the schedule lives;
* :class:`~celery_zsched.config.schedule.ScheduleSettings`: batches, deadlines, retries;
* :class:`~celery_zsched.config.pacing.PacingSettings`: per-domain pacing;
* :class:`~celery_zsched.config.robots.RobotsSettings`: robots.txt and the capacity planner;
* :class:`~celery_zsched.config.metrics.MetricsSettings`: beat's metrics server;
* :class:`~celery_zsched.config.server.ServerSettings`: ``zsched serve``;
* :class:`~celery_zsched.config.notify.NotifySettings`: the notifiers;
* :class:`~celery_zsched.config.tracing.TracingSettings`: OpenTelemetry tracing.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from celery_zsched.config.load import (
    ENV_PREFIX,
    INTEGRATION_SETTINGS,
    SETTING_PREFIX,
    cert_reqs_name,
    coerce,
    redact_url,
)
from celery_zsched.config.metrics import MetricsSettings
from celery_zsched.config.notify import NotifySettings
from celery_zsched.config.pacing import PacingSettings
from celery_zsched.config.redis import DEFAULT_PREFIX, DEFAULT_REDIS_URL, RedisSettings
from celery_zsched.config.robots import RobotsSettings
from celery_zsched.config.schedule import ScheduleSettings
from celery_zsched.config.server import SCOPES, ServerSettings, api_token_scopes
from celery_zsched.config.tracing import TracingSettings
from celery_zsched.core.errors import ConfigurationError

__all__ = [
    "DEFAULT_PREFIX", "DEFAULT_REDIS_URL", "ENV_PREFIX", "INTEGRATION_SETTINGS", "SCOPES",
    "SETTING_PREFIX", "MetricsSettings", "NotifySettings", "PacingSettings", "RedisSettings",
    "RobotsSettings", "ScheduleSettings", "ServerSettings", "Settings", "TracingSettings",
    "api_token_scopes",
    "redact_url",
]

#: ``broker_use_ssl`` keys (kombu's Redis transport) that fill our TLS settings.
_BROKER_SSL_SETTINGS = frozenset({"redis_ssl_ca_certs", "redis_ssl_certfile",
                                  "redis_ssl_keyfile", "redis_ssl_cert_reqs"})


# Bases are listed last-section-first: a dataclass takes its fields from the
# bases in reverse, so the fields (and the generated reference) start with Redis.
@dataclass(frozen=True)
class Settings(TracingSettings, NotifySettings, ServerSettings, MetricsSettings,
               RobotsSettings, PacingSettings, ScheduleSettings, RedisSettings):
    """Every knob of celery-zsched, with its default.

    Read with :meth:`from_app` (Celery config, then environment) lazily, never at
    import time.
    """

    @classmethod
    def names(cls) -> list[str]:
        """The setting names, without prefix."""
        return [f.name for f in fields(cls)]

    @classmethod
    def from_mapping(
        cls, conf: Mapping[str, Any], env: Mapping[str, str] | None = None
    ) -> Settings:
        """Build from ``zsched_*`` keys of ``conf``, overridden by ``ZSCHED_*`` in ``env``.

        An unknown ``zsched_*`` key is an error, so a typo never passes silently.
        """
        env = os.environ if env is None else env
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, raw in conf.items():
            if not isinstance(key, str) or not key.lower().startswith(SETTING_PREFIX):
                continue
            name = key.lower()[len(SETTING_PREFIX):]
            if name in INTEGRATION_SETTINGS:
                continue
            if name not in known:
                raise ConfigurationError(
                    f"unknown setting {key!r}; known: "
                    + ", ".join(SETTING_PREFIX + n for n in known)
                )
            if raw is not None:
                values[name] = coerce(known[name], raw, key)
        for name, f in known.items():
            env_key = ENV_PREFIX + name.upper()
            if env_key in env:
                values[name] = coerce(f, env[env_key], env_key)
        settings = cls(**values)
        settings.validate()
        return settings

    @classmethod
    def from_app(cls, app: Any) -> Settings:
        """Settings of a Celery app; the Redis URL falls back to a Redis broker URL.

        With ``app.config_from_object(obj, namespace="CELERY")`` (the Django
        convention) the settings are read from ``CELERY_ZSCHED_*`` as well.
        """
        conf = app.conf
        namespace = str(getattr(app, "namespace", None) or "")
        namespace = namespace.rstrip("_").upper() + "_" if namespace else ""
        mapping: dict[str, Any] = {}
        for key in list(conf.keys()):
            name = str(key)
            if namespace and name.upper().startswith(namespace):
                name = name[len(namespace):]
            if name.lower().startswith(SETTING_PREFIX):
                mapping[name] = conf.get(key)
        return cls.from_mapping(mapping).with_broker_fallback(
            conf.broker_url, conf.broker_transport_options, conf.broker_use_ssl)

    def with_broker_fallback(self, broker_url: Any,
                             transport_options: Mapping[str, Any] | None = None,
                             use_ssl: Any = None) -> Settings:
        """These settings, with an empty ``redis_url`` filled in.

        The fallback is the broker URL when that is Redis (``redis://``,
        ``rediss://``, ``unix://`` or kombu's ``sentinel://``), else
        ``redis://localhost:6379/0``: beat, workers and Django agree on it.
        With the broker's URL come the broker's connection options when the
        matching ``zsched_*`` settings are empty: the Sentinel master
        (``broker_transport_options['master_name']``), the Sentinels' password
        (``...['sentinel_kwargs']['password']``) and the TLS files and
        ``ssl_cert_reqs`` of ``broker_use_ssl``.
        """
        if self.redis_url:
            return self
        broker = str(broker_url or "")
        is_redis = broker.startswith(("redis://", "rediss://", "unix://", "sentinel://"))
        if not is_redis:
            return dataclasses.replace(self, redis_url=DEFAULT_REDIS_URL)
        values: dict[str, Any] = {"redis_url": broker}
        options = dict(transport_options or {})
        if broker.startswith("sentinel://"):
            sentinel_kwargs = dict(options.get("sentinel_kwargs") or {})
            for name, value in (("sentinel_master", options.get("master_name")),
                                ("sentinel_username", sentinel_kwargs.get("username")),
                                ("sentinel_password", sentinel_kwargs.get("password"))):
                if value and not getattr(self, name):
                    values[name] = str(value)
        if use_ssl and not broker.startswith("unix://"):
            if broker.startswith("sentinel://"):
                values["redis_ssl"] = True
            for key, value in (use_ssl.items() if isinstance(use_ssl, Mapping) else ()):
                name = "redis_" + str(key)
                if name in _BROKER_SSL_SETTINGS and value is not None \
                        and not getattr(self, name):
                    values[name] = cert_reqs_name(value) if key == "ssl_cert_reqs" else str(value)
        settings = dataclasses.replace(self, **values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Raise :class:`ConfigurationError` naming the first bad value, section by section."""
        self._check_schedule()
        self._check_metrics()
        self._check_pacing()
        self._check_robots()
        self._check_notify()
        self._check_server()
        self.check_connection()
