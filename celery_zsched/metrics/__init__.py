"""Beat's own Prometheus metrics (``zsched_metrics_port``), served from beat's process.

Only what beat alone knows lives here: how long its claims and publishes take,
what it promoted and how late. Everything shared (backlog, in flight, settles)
is read from Redis by ``zsched exporter`` (:mod:`celery_zsched.metrics.exporter`), so
it does not depend on which beat or worker process happens to be alive.

The metrics sit in a dedicated :class:`CollectorRegistry`, not the global one:
a project's own ``prometheus_client`` metrics (or a second scheduler built in
the same process, as the tests do) must never collide with these names.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from celery_zsched.core.errors import ConfigurationError
from celery_zsched.core.telemetry import log_event

if TYPE_CHECKING:
    from prometheus_client import Histogram

    from celery_zsched.config import Settings
    from celery_zsched.store import Claimed

logger = logging.getLogger("celery_zsched")

#: Claim and publish durations (s): a claim of 1,000 jobs takes a few ms; a
#: slow broker or a Redis failover pushes it to seconds.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0)
#: Dispatch lag (s): on time is within a tick (<= 1 s); the alert is p99 > 5 s.
LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
               3600.0)

_lock = threading.Lock()
#: One server (and registry) per address and port in this process: beat builds
#: its scheduler once, but a restarted service, or a test, may build another;
#: binding the port twice would fail and registering the names twice would raise.
_served: dict[tuple[str, int], BeatMetrics] = {}


class BeatMetrics:
    """What the scheduler records; every method is a no-op when metrics are off."""

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled
        if not enabled:
            return
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.ticks = Counter("zsched_beat_ticks", "Beat ticks that reached Redis.",
                             registry=reg)
        self.failures = Counter("zsched_beat_tick_failures",
                                "Beat ticks that failed: Redis or the broker unreachable.",
                                registry=reg)
        self.claim_seconds = Histogram("zsched_beat_claim_seconds",
                                       "Time of one tick's claim (all its partitions).",
                                       buckets=DURATION_BUCKETS, registry=reg)
        self.publish_seconds = Histogram("zsched_beat_publish_seconds",
                                         "Time of publishing one claimed batch.",
                                         buckets=DURATION_BUCKETS, registry=reg)
        self.promoted = Counter("zsched_beat_promoted",
                                "Messages this beat published.", registry=reg)
        self.dispatch_lag = Histogram(
            "zsched_beat_dispatch_lag_seconds",
            "Promote time minus due time of each claimed job, on the Redis clock.",
            buckets=LAG_BUCKETS, registry=reg)
        self.last_tick = Gauge("zsched_beat_last_tick_timestamp_seconds",
                               "Unix time (beat host clock) of the last tick that reached Redis.",
                               registry=reg)

    @classmethod
    def for_settings(cls, settings: Settings) -> BeatMetrics:
        """Metrics serving on ``zsched_metrics_addr:zsched_metrics_port``, started once.

        Off (port 0), or if the port cannot be bound: a no-op. Beat keeps
        scheduling without metrics rather than die for them (logged as an error).
        """
        if not settings.metrics_port:
            return cls()
        where = (settings.metrics_addr, settings.metrics_port)
        with _lock:
            if where not in _served:
                from prometheus_client import start_http_server

                try:
                    metrics = cls(enabled=True)
                except ImportError as exc:
                    raise ConfigurationError(
                        "zsched_metrics_port needs prometheus-client: "
                        "pip install 'celery-zsched[metrics]'") from exc
                try:
                    start_http_server(where[1], where[0], registry=metrics.registry)
                except OSError as exc:
                    logger.error("zsched: cannot serve metrics on %s:%d: %s", *where, exc)
                    return cls()
                log_event("metrics_serving", addr=where[0], port=where[1])
                _served[where] = metrics
            return _served[where]

    @contextmanager
    def time_claim(self) -> Iterator[None]:
        """Observe the enclosed claim's duration (only when it returns)."""
        with self._timed(self.claim_seconds if self.enabled else None):
            yield

    @contextmanager
    def time_publish(self) -> Iterator[None]:
        """Observe the enclosed publish's duration (only when it returns)."""
        with self._timed(self.publish_seconds if self.enabled else None):
            yield

    @staticmethod
    @contextmanager
    def _timed(histogram: Histogram | None) -> Iterator[None]:
        started = time.perf_counter()
        yield
        # A failed call is counted by ``failure``, not timed: a timeout would
        # otherwise look like a slow claim.
        if histogram is not None:
            histogram.observe(time.perf_counter() - started)

    def tick(self, claimed: Sequence[Claimed], promoted: int) -> None:
        """A tick that reached Redis: what it claimed and how many it published."""
        if not self.enabled:
            return
        self.ticks.inc()
        self.promoted.inc(promoted)
        for job in claimed:
            # Both stamps come from the Redis clock: no skew between hosts.
            self.dispatch_lag.observe(max(0, job.promoted_ms - job.due_ms) / 1000.0)
        self.last_tick.set(time.time())

    def failure(self) -> None:
        """A tick that could not reach Redis or the broker."""
        if self.enabled:
            self.failures.inc()


class _Extension:
    """Beat's metrics as an extension: an observer of its ticks while
    ``zsched_metrics_port`` is set (none otherwise: nothing is imported)."""

    def beat_observer(self, settings: Settings) -> BeatMetrics | None:
        return BeatMetrics.for_settings(settings) if settings.metrics_port else None


#: Registered under the ``celery_zsched.extensions`` entry point group.
EXTENSION = _Extension()
