"""Settings: lowercase ``zsched_*`` Celery settings, each with a ``ZSCHED_*`` env override."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .errors import ConfigurationError
from .keys import DEFAULT_PREFIX

SETTING_PREFIX = "zsched_"
ENV_PREFIX = "ZSCHED_"
#: Settings an integration owns and validates (celery_zsched.contrib.django reads
#: these two): beat accepts them in a shared CELERY_ZSCHED_* namespace and
#: leaves them alone, so a Django project's settings never fail beat's check.
INTEGRATION_SETTINGS = frozenset({"history_days", "redis_alias"})
#: Where the schedule lives when neither zsched_redis_url nor a Redis broker says.
DEFAULT_REDIS_URL = "redis://localhost:6379/0"


@dataclass(frozen=True)
class Settings:
    """Every knob of celery-zsched, with its default.

    Read with :meth:`from_app` (Celery config, then environment) lazily, never at
    import time.
    """

    #: Redis holding the schedule. Empty: the broker URL when it is Redis,
    #: else ``redis://localhost:6379/0``.
    redis_url: str = ""
    #: Prefix of every key; a Redis Cluster hash tag is added when missing.
    key_prefix: str = DEFAULT_PREFIX
    #: Most jobs one claim takes (and one publish batch sends).
    batch_size: int = 1000
    #: Execution lease: seconds a started task may go without a worker heartbeat
    #: before it is presumed crashed and redelivered. Workers beat every third of it.
    lease_s: float = 60.0
    #: Delivery deadline: seconds a published message may wait unstarted while a
    #: worker is alive before it is presumed lost by the broker and republished.
    delivery_timeout_s: float = 7200.0
    #: Most occurrences published and not yet started (backpressure); past it,
    #: due jobs wait in the schedule, not in the broker. 0: 10 x batch_size.
    max_queued: int = 0
    #: Default ``jitter_s`` of jobs that do not set their own.
    max_jitter_s: float = 0.0
    #: Interval of jobs that give no timing at all (for example a bare URL row).
    default_interval_s: float = 300.0
    #: Task that URL jobs run, called as ``task(url=..., meta=...)``.
    default_task: str = "scrape"
    #: Retries after an error before the job waits for its next regular run.
    retry_max: int = 3
    #: First retry delay; each further retry doubles it.
    retry_base_s: float = 30.0
    #: Largest retry delay.
    retry_cap_s: float = 3600.0
    #: Crashed executions of one occurrence (execution leases that ended with no
    #: settle) before it is dead-lettered. Waiting never counts.
    max_deliveries: int = 5
    #: Default ``misfire_grace_s``: skip a fire later than this. 0 never skips.
    misfire_grace_s: float = 0.0
    #: Approximate cap of the settle event stream.
    events_maxlen: int = 100_000
    #: Rows per pipelined chunk in bulk imports.
    import_chunk: int = 5000

    @property
    def queued_bound(self) -> int:
        """The backpressure bound in force (``max_queued``, or 10 x ``batch_size``)."""
        return self.max_queued or 10 * self.batch_size

    @property
    def heartbeat_s(self) -> float:
        """How often workers extend their execution leases: a third of the lease."""
        return self.lease_s / 3

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
                values[name] = _coerce(known[name], raw, key)
        for name, f in known.items():
            env_key = ENV_PREFIX + name.upper()
            if env_key in env:
                values[name] = _coerce(f, env[env_key], env_key)
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
        return cls.from_mapping(mapping).with_broker_fallback(conf.broker_url)

    def with_broker_fallback(self, broker_url: Any) -> Settings:
        """These settings, with an empty ``redis_url`` filled in.

        The fallback is the broker URL when that is Redis, else
        ``redis://localhost:6379/0``: beat, workers and Django agree on it.
        """
        if self.redis_url:
            return self
        broker = str(broker_url or "")
        is_redis = broker.startswith(("redis://", "rediss://", "unix://"))
        return dataclasses.replace(self, redis_url=broker if is_redis else DEFAULT_REDIS_URL)

    def validate(self) -> None:
        """Raise :class:`ConfigurationError` naming the first bad value."""
        positive = ("batch_size", "lease_s", "delivery_timeout_s", "default_interval_s",
                    "retry_base_s", "retry_cap_s", "max_deliveries", "events_maxlen",
                    "import_chunk")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigurationError(
                    f"{SETTING_PREFIX}{name} must be > 0, got {getattr(self, name)!r}"
                )
        for name in ("max_jitter_s", "retry_max", "misfire_grace_s", "max_queued"):
            if getattr(self, name) < 0:
                raise ConfigurationError(
                    f"{SETTING_PREFIX}{name} must be >= 0, got {getattr(self, name)!r}"
                )


def _coerce(f: dataclasses.Field[Any], raw: Any, source: str) -> Any:
    kind = type(f.default)
    try:
        if kind is str:
            return str(raw)
        if kind is int and not isinstance(raw, bool):
            return int(raw)
        if kind is float and not isinstance(raw, bool):
            return float(raw)
    except (TypeError, ValueError):
        pass
    raise ConfigurationError(f"{source} must be a {kind.__name__}, got {raw!r}")


def redact_url(url: str) -> str:
    """``url`` with its credentials masked, for logs and banners.

    The last ``@`` ends the credentials: a password may contain ``@`` itself.
    """
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url
