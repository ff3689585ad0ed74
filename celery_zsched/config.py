"""Settings: lowercase ``zsched_*`` Celery settings, each with a ``ZSCHED_*`` env override."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .domains import PacingDefaults
from .errors import ConfigurationError
from .keys import DEFAULT_PREFIX

SETTING_PREFIX = "zsched_"
ENV_PREFIX = "ZSCHED_"
#: Settings an integration owns and validates (celery_zsched.contrib.django reads
#: these): beat accepts them in a shared CELERY_ZSCHED_* namespace and leaves
#: them alone, so a Django project's settings never fail beat's check.
INTEGRATION_SETTINGS = frozenset({"history_days", "redis_alias", "outbox_interval_s",
                                  "outbox_backoff_max_s", "outbox_max_attempts",
                                  "outbox_warn_s"})
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
    #: Most jobs one claim takes (and one publish batch sends).
    batch_size: int = 1000
    #: Execution lease: seconds a started task may go without a worker heartbeat
    #: before it is presumed crashed and redelivered. Workers beat every third of it,
    #: and hold the messages they received but did not start under the same lease.
    lease_s: float = 30.0
    #: Publish deadline: seconds a claimed occurrence may wait for beat to confirm
    #: its publish; past it (beat died between claim and publish) it is due again.
    publish_timeout_s: float = 30.0
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
    #: Approximate cap of each partition's audit stream (changes to jobs, see the
    #: README's "Operating it: audit trail"); 0 records no changes.
    audit_maxlen: int = 100_000
    #: Seconds a versioned delete (the Django outbox) keeps its tombstone, so an
    #: older write that arrives late cannot bring the job back.
    tombstone_ttl_s: float = 86_400.0
    #: Rows per pipelined chunk in bulk imports.
    import_chunk: int = 5000
    #: Pace requests per domain in the claim (see the README's "Politeness").
    pacing: bool = False
    #: Least delay between the starts of two requests to one domain.
    domain_delay_s: float = 1.0
    #: Worker starts of two requests to one domain are at least the delay plus
    #: this apart: it absorbs the worker's own path from its start to the socket.
    domain_start_margin_s: float = 0.05
    #: Most requests to one domain in flight (claimed and not settled); 0: no cap.
    domain_max_in_flight: int = 1
    #: Group hosts by registrable domain (eTLD+1, Public Suffix List).
    domain_registrable: bool = False
    #: Cap of a domain's adaptive delay.
    domain_max_delay_s: float = 300.0
    #: A 429 without Retry-After multiplies the domain's delay by this.
    domain_backoff: float = 2.0
    #: Each success takes this off a raised delay, never going below the base.
    domain_decrease_s: float = 0.5
    #: The breaker opens when this share of a domain's recent requests failed...
    breaker_ratio: float = 0.5
    #: ... over a window this long ...
    breaker_window_s: float = 60.0
    #: ... with at least this many requests in it ...
    breaker_min_requests: int = 10
    #: ... and stays open this long before one probe goes out.
    breaker_cooldown_s: float = 30.0
    #: Port of beat's Prometheus ``/metrics`` (see the README's "Operating it:
    #: metrics"); 0: no metrics server.
    metrics_port: int = 0
    #: Address beat's metrics server binds. Loopback by default: metrics say how
    #: big the fleet is and how it fares, so exposing them is a deliberate choice.
    metrics_addr: str = "127.0.0.1"
    #: Bearer tokens of the HTTP server (``zsched serve``): comma-separated
    #: ``token:scope`` pairs, scope ``read``, ``write`` or ``worker`` (the job
    #: gateway). Empty: no token, so every request is refused.
    api_tokens: str = ""
    #: Longest a ``GET /jobs/next`` long-poll waits for a due job before ``204``.
    gateway_timeout_s: float = 30.0
    #: Execution lease of a job the gateway hands out: unreported (no complete,
    #: error or heartbeat) for this long, it comes back, as from a dead worker.
    gateway_lease_s: float = 60.0
    #: Key of the gateway's lease tokens (an HMAC of job, occurrence and attempt):
    #: the same on every server of a deployment, required once a worker token is set.
    gateway_lease_secret: str = ""
    #: The lease secret before the last rotation: still accepted for one lease period
    #: after the server starts, so leases handed out before a rotation can be reported.
    gateway_lease_secret_previous: str = ""
    #: Most long-polls (``GET /jobs/next``) waiting at once; past it ``503`` with
    #: Retry-After. 0: half of the connection cap.
    gateway_max_polls: int = 0
    #: Most open HTTP connections of ``zsched serve``; past it the oldest idle one
    #: is closed, or the new one answered ``503``. 0: the process's soft fd limit
    #: minus a reserve (store connections, files), so accept() never runs out of fds.
    http_max_connections: int = 0
    #: Seconds a connection may take to send a request's headers (from its opening,
    #: or from the end of the previous answer); then it is closed.
    http_header_timeout_s: float = 10.0
    #: Longest pause, in seconds, between two reads of a request body; then the
    #: connection is closed.
    http_body_timeout_s: float = 30.0
    #: Seconds an idle keep-alive connection is kept open after an answer.
    http_keepalive_s: float = 5.0
    #: Signals the built-in notifiers report (comma-separated names; see the
    #: README's "Operating it: notifications").
    notify_events: str = ("job_retries_exhausted,job_dead_lettered,job_failing_streak,"
                          "domain_breaker_opened")
    #: ``job_failing_streak`` fires when a job's errors in a row reach this; 0: never.
    notify_streak: int = 5
    #: POST each notice as signed JSON to this URL; empty: no webhook.
    notify_webhook_url: str = ""
    #: Key of the HMAC-SHA256 signature header; empty: unsigned.
    notify_webhook_secret: str = ""
    #: Seconds one webhook request may take.
    notify_webhook_timeout_s: float = 5.0
    #: Webhook retries after a failed request (5xx, 408, 429, network), with backoff.
    notify_webhook_retries: int = 3
    #: Mail each notice to Django's ADMINS (``mail_admins``; needs the Django app).
    notify_mail: bool = False
    #: At most one notice per job (or domain) and signal in this many seconds.
    notify_window_s: float = 3600.0
    #: More notices than this in one digest window are held for one digest.
    notify_digest_threshold: int = 20
    #: Length of a digest window, seconds.
    notify_digest_window_s: float = 60.0
    #: Notices a process buffers for its sender thread; past it they are dropped.
    notify_queue_size: int = 10_000

    @property
    def queued_bound(self) -> int:
        """The backpressure bound in force (``max_queued``, or 10 x ``batch_size``)."""
        return self.max_queued or 10 * self.batch_size

    @property
    def heartbeat_s(self) -> float:
        """How often workers extend their execution leases: a third of the lease."""
        return self.lease_s / 3

    @property
    def pacing_defaults(self) -> PacingDefaults:
        """The pacing settings as the Lua scripts read them (ms)."""
        return PacingDefaults(
            delay_ms=round(self.domain_delay_s * 1000), cap=self.domain_max_in_flight,
            max_delay_ms=round(self.domain_max_delay_s * 1000), backoff=self.domain_backoff,
            decrease_ms=round(self.domain_decrease_s * 1000), breaker_ratio=self.breaker_ratio,
            breaker_window_ms=round(self.breaker_window_s * 1000),
            breaker_min=self.breaker_min_requests,
            breaker_cooldown_ms=round(self.breaker_cooldown_s * 1000),
            start_margin_ms=round(self.domain_start_margin_s * 1000))

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
                    values[name] = _cert_reqs_name(value) if key == "ssl_cert_reqs" else str(value)
        settings = dataclasses.replace(self, **values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Raise :class:`ConfigurationError` naming the first bad value."""
        positive = ("batch_size", "lease_s", "publish_timeout_s", "delivery_timeout_s",
                    "default_interval_s",
                    "retry_base_s", "retry_cap_s", "max_deliveries", "events_maxlen",
                    "import_chunk", "partitions", "gateway_timeout_s", "gateway_lease_s",
                    "tombstone_ttl_s", "http_header_timeout_s", "http_body_timeout_s",
                    "http_keepalive_s")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigurationError(
                    f"{SETTING_PREFIX}{name} must be > 0, got {getattr(self, name)!r}"
                )
        for name in ("max_jitter_s", "retry_max", "misfire_grace_s", "max_queued", "audit_maxlen",
                     "domain_delay_s", "domain_max_in_flight", "domain_decrease_s",
                     "domain_start_margin_s", "breaker_min_requests", "gateway_max_polls",
                     "http_max_connections"):
            if getattr(self, name) < 0:
                raise ConfigurationError(
                    f"{SETTING_PREFIX}{name} must be >= 0, got {getattr(self, name)!r}"
                )
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigurationError(
                f"{SETTING_PREFIX}metrics_port must be in 0-65535 (0: off), "
                f"got {self.metrics_port!r}")
        self._validate_pacing()
        self._validate_notify()
        api_token_scopes(self.api_tokens)
        from .connection import check_settings  # connection imports this module

        check_settings(self)

    def _validate_pacing(self) -> None:
        for name in ("domain_max_delay_s", "breaker_window_s", "breaker_cooldown_s"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(
                    f"{SETTING_PREFIX}{name} must be > 0, got {getattr(self, name)!r}")
        if self.domain_backoff < 1:
            raise ConfigurationError(
                f"{SETTING_PREFIX}domain_backoff must be >= 1, got {self.domain_backoff!r}")
        if not 0 < self.breaker_ratio <= 1:
            raise ConfigurationError(
                f"{SETTING_PREFIX}breaker_ratio must be in (0, 1], got {self.breaker_ratio!r}")
        if self.pacing and self.partitions > 1:
            # A domain's gate must share a slot with every job of the domain, and
            # jobs are placed by id: exact pacing needs one partition for now.
            raise ConfigurationError(
                f"{SETTING_PREFIX}pacing needs {SETTING_PREFIX}partitions = 1, "
                f"got {self.partitions}")

    @property
    def notify_event_names(self) -> tuple[str, ...]:
        """``notify_events`` as a tuple of signal names."""
        return tuple(n.strip() for n in self.notify_events.split(",") if n.strip())

    @property
    def notify_on(self) -> bool:
        """Whether a built-in notifier is switched on."""
        return bool(self.notify_webhook_url or self.notify_mail)

    def _validate_notify(self) -> None:
        from urllib.parse import urlsplit

        from .signals import SIGNALS

        for name in ("notify_window_s", "notify_digest_window_s", "notify_webhook_timeout_s",
                     "notify_queue_size"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(
                    f"{SETTING_PREFIX}{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("notify_streak", "notify_webhook_retries", "notify_digest_threshold"):
            if getattr(self, name) < 0:
                raise ConfigurationError(
                    f"{SETTING_PREFIX}{name} must be >= 0, got {getattr(self, name)!r}")
        unknown = [n for n in self.notify_event_names if n not in SIGNALS]
        if unknown:
            raise ConfigurationError(
                f"{SETTING_PREFIX}notify_events: unknown signal {unknown[0]!r}; known: "
                + ", ".join(SIGNALS))
        url = self.notify_webhook_url
        if url:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigurationError(
                    f"{SETTING_PREFIX}notify_webhook_url must be an http:// or https:// URL, "
                    f"got {url!r}")
        elif self.notify_webhook_secret:
            raise ConfigurationError(
                f"{SETTING_PREFIX}notify_webhook_secret is set but "
                f"{SETTING_PREFIX}notify_webhook_url is empty")


#: What a bearer token may do: ``read`` and ``write`` the management API, or
#: take and report jobs through the gateway (``worker``).
SCOPES = ("read", "write", "worker")
#: Shortest token accepted: a short one is guessable whatever the comparison.
MIN_TOKEN_CHARS = 16


def api_token_scopes(raw: str) -> dict[str, str]:
    """``zsched_api_tokens`` as token -> scope; :class:`ConfigurationError` names a bad entry."""
    out: dict[str, str] = {}
    for n, entry in enumerate(raw.split(","), 1):
        entry = entry.strip()
        if not entry:
            continue
        token, sep, scope = entry.rpartition(":")
        token, scope = token.strip(), scope.strip().lower()
        if not sep or scope not in SCOPES:
            raise ConfigurationError(
                f"{SETTING_PREFIX}api_tokens entry {n} must be token:scope with scope one of "
                f"{', '.join(SCOPES)}")
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigurationError(
                f"{SETTING_PREFIX}api_tokens entry {n}: a token must be at least "
                f"{MIN_TOKEN_CHARS} characters")
        out[token] = scope
    return out


#: ``broker_use_ssl`` keys (kombu's Redis transport) that fill our TLS settings.
_BROKER_SSL_SETTINGS = frozenset({"redis_ssl_ca_certs", "redis_ssl_certfile",
                                  "redis_ssl_keyfile", "redis_ssl_cert_reqs"})


def _cert_reqs_name(value: Any) -> str:
    """``ssl.CERT_REQUIRED`` (or its name, or redis-py's) as redis-py's ``required``."""
    import ssl

    if isinstance(value, int):  # ssl.VerifyMode is an IntEnum
        names = {int(ssl.CERT_NONE): "none", int(ssl.CERT_OPTIONAL): "optional",
                 int(ssl.CERT_REQUIRED): "required"}
        return names.get(int(value), str(value))
    text = str(value).strip().lower()
    return text[len("cert_"):] if text.startswith("cert_") else text


def _coerce(f: dataclasses.Field[Any], raw: Any, source: str) -> Any:
    kind: type[Any] = type(f.default)
    try:
        if kind is bool:
            return _as_bool(raw)
        if kind is str:
            # A list of names (zsched_notify_events) may be given as a list.
            return ",".join(map(str, raw)) if isinstance(raw, list | tuple) else str(raw)
        if kind is int and not isinstance(raw, bool):
            return int(raw)
        if kind is float and not isinstance(raw, bool):
            return float(raw)
    except (TypeError, ValueError):
        pass
    raise ConfigurationError(f"{source} must be {_KIND_WORDS.get(kind, kind.__name__)}, "
                             f"got {raw!r}")


#: What a setting of each type must be, in words ("an integer", not "a int").
_KIND_WORDS: dict[type[Any], str] = {bool: "true or false", str: "a string",
                                     int: "an integer", float: "a number"}


def _as_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(text)


def redact_url(url: str) -> str:
    """``url`` with its credentials masked, for logs and banners.

    The last ``@`` ends the credentials: a password may contain ``@`` itself.
    """
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url
