"""``zsched exporter``: Prometheus metrics of the shared state, read from Redis on each scrape.

Everything here is read from the store, never from a process's memory: the
figures workers produce (settles, redeliveries, start times) are already in
Redis (the counters hash and the settle event stream), so they survive the
prefork pool, worker restarts and any number of hosts without a per-process
registry or a ``PROMETHEUS_MULTIPROC_DIR``.

A scrape costs two round trips: ``TIME`` (with the Django outbox's report),
then one pipeline over every partition (with a random sample of job states for
the fleet's freshness: :mod:`celery_zsched.metrics.recrawl`); with pacing on, the domain hashes are
scanned too (``HSCAN``, one round trip per few hundred domains). No label grows
with the number of jobs; per-domain series exist only for the ``top_domains``
worst domains.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from celery_zsched.core.domains import DomainInfo
from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.core.planner import DomainPlan
from celery_zsched.core.results import OutboxReport
from celery_zsched.metrics import recrawl
from celery_zsched.services import planner
from celery_zsched.store import Store
from celery_zsched.store.errors import redis_unavailable
from celery_zsched.store.keys import Keys

logger = logging.getLogger("celery_zsched")

#: Start lag buckets (s): task start minus due time, queueing in the broker included.
START_LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
                     3600.0)
#: Settle events read per partition and scrape. More waiting are read by the
#: next scrapes; events trimmed from the stream (``zsched_events_maxlen``)
#: before a scrape reads them are never counted.
EVENTS_PER_SCRAPE = 10_000
#: Job states, as the store's sets and sorted sets hold them.
STATES = ("scheduled", "queued", "running", "paused", "dead")
#: Settle outcomes, as the counters hash names them.
OUTCOMES = ("complete", "error", "retrying", "skipped", "blocked_by_robots")
#: Further counters of the counters hash: (hash field, metric name, help).
COUNTERS = (
    ("promoted", "zsched_promoted", "Occurrences promoted by every beat (claimed for publish)."),
    ("redelivered", "zsched_redeliveries", "Crashed executions redelivered (lease expired)."),
    ("lost", "zsched_lost_messages", "Published messages presumed lost by the broker, resent."),
    ("dead", "zsched_dead_lettered", "Occurrences dead-lettered (max deliveries spent)."),
    ("started", "zsched_started", "Task starts a worker recorded."),
    ("duplicates", "zsched_duplicate_deliveries", "Duplicate deliveries a worker dropped."),
    ("deferred", "zsched_deferred_starts", "Starts a worker deferred (domain pacing)."),
    ("held", "zsched_domain_holds", "Due jobs a claim held back for their domain's pacing."),
    ("queue_held", "zsched_queue_holds",
     "Due jobs a claim held back because their queue was at its backpressure bound."),
    ("orphaned", "zsched_orphaned_messages",
     "Messages a worker received, then died holding unstarted: republished one lease later."),
    ("unpublished", "zsched_unpublished_claims",
     "Claims whose beat died before confirming the publish: republished at the publish deadline."),
    ("refused", "zsched_refused_deliveries",
     "Deliveries a worker refused at start: never promoted so, or under another task name."),
    ("history_skipped", "zsched_history_skipped_events",
     "Settle events the run history's drain could not convert: skipped and logged."),
)


@dataclass
class _Histogram:
    """A cumulative histogram kept across scrapes (the exporter's only state)."""

    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        buckets, running = [], 0
        for bound, count in zip([*map(str, self.bounds), "+Inf"], self.counts, strict=True):
            running += count
            buckets.append((bound, running))
        return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=self.total)


class StoreCollector(Collector):
    """A custom collector: every scrape reads the store (see the module's docstring)."""

    def __init__(self, store: Store, top_domains: int = 10) -> None:
        self.store = store
        self.top_domains = top_domains
        self.start_lag = _Histogram(START_LAG_BUCKETS)
        # Per partition, the last settle event read (None: not positioned yet).
        self._cursors: list[str | None] = [None] * store.partitions
        # Scrapes may run in parallel (threaded server); the cursors and the
        # histogram must advance once per event.
        self._lock = threading.Lock()
        self._planner: threading.Thread | None = None

    def describe(self) -> Iterable[Metric]:
        # Nothing: registering must not touch Redis (the default would collect).
        return []

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        with self._lock:
            try:
                families = list(self._read())
                up = 1
            except (StoreUnavailable, redis.RedisError) as exc:
                # Never raise into the HTTP server: Prometheus gets zsched_up 0
                # (alertable) and the exporter keeps serving until Redis is back.
                logger.warning("zsched exporter: cannot read %s: %s",
                               self.store.base.prefix, exc)
                families, up = [], 0
        yield from families
        yield GaugeMetricFamily("zsched_up", "1 if the last scrape could read Redis, else 0.",
                                value=up)
        yield GaugeMetricFamily("zsched_scrape_duration_seconds",
                                "Time the exporter took to read Redis for this scrape.",
                                value=time.perf_counter() - started)

    # ------------------------------------------------------------- reading
    def _read(self) -> Iterator[Metric]:
        store = self.store
        with redis_unavailable():
            # Redis' clock, and the Django outbox's last report, in one round trip.
            outbox = store.outbox_report()
            now = outbox.now_ms
            replies = store._pipeline_each(lambda pipe, keys: self._queue(pipe, keys, now))
        names = ("defs", *STATES, "due")
        totals = dict.fromkeys((*names, "expired", "http_due"), 0)
        oldest: int | None = None
        counters: dict[str, int] = {}
        queues: dict[str, list[int]] = {}
        samples = []
        for part, reply in enumerate(replies):
            (*counts, first, expired, hash_, events, http_waiting, http_due, flights,
             held, sample) = reply
            samples.append(sample)
            for column, per_queue in enumerate((flights, held)):
                for queue, n in (per_queue or {}).items():
                    queues.setdefault(str(queue), [0, 0])[column] += max(0, int(n))
            for name, value in zip(names, counts, strict=True):
                totals[name] += int(value)
            # HTTP jobs are jobs like any: scheduled counts them; their own
            # backlog says whether the HTTP workers keep up.
            totals["scheduled"] += int(http_waiting)
            totals["http_due"] += int(http_due)
            totals["expired"] += int(expired)
            if first and int(first[0][1]) <= now:
                oldest = min(oldest if oldest is not None else now, int(first[0][1]))
            for key, value in (hash_ or {}).items():
                counters[str(key)] = counters.get(str(key), 0) + int(value)
            self._advance(part, events or [])
        yield from self._job_families(totals, now - oldest if oldest is not None else 0)
        yield from self._outbox_families(outbox)
        yield from self._counter_families(counters)
        yield from self._queue_families(queues)
        yield from recrawl.fleet_families(recrawl.sample_states(samples))
        yield self.start_lag.family(
            "zsched_start_lag_seconds",
            "Task start minus due time, from settle events read since the exporter started.")
        if store.settings.pacing:
            with redis_unavailable():
                domains = store.domains()
                shared, due = planner.shared(store)
            if due:
                self._replan()
            yield from self._domain_families(domains)
            plans: list[DomainPlan] = []
            if shared is not None:
                with redis_unavailable():
                    _infos, by_name, _ = planner.domain_plans(store, domains, result=shared)
                plans = list(by_name.values())
            yield from self._planner_families(plans, outbox.now_ms, shared)

    def _replan(self) -> None:
        """Recompute the planner's demand in the background: a scan of a large store
        takes seconds, longer than a scrape should (the next scrapes show it)."""
        if self._planner is not None and self._planner.is_alive():
            return

        def run() -> None:
            try:
                planner.demand(self.store)
            except (StoreUnavailable, redis.RedisError) as exc:
                logger.warning("zsched exporter: the capacity planner's scan failed: %s", exc)
        self._planner = threading.Thread(target=run, name="zsched-planner", daemon=True)
        self._planner.start()

    def _queue(self, pipe: Any, keys: Keys, now: int) -> None:
        """Queue one partition's reads (their order is unpacked in :meth:`_read`)."""
        pipe.hlen(keys.defs)
        pipe.zcard(keys.schedule)
        pipe.zcard(keys.queued)
        pipe.zcard(keys.leases)
        pipe.scard(keys.paused)
        pipe.zcard(keys.dead)
        pipe.zcount(keys.schedule, "-inf", now)
        pipe.zrange(keys.schedule, 0, 0, withscores=True)
        pipe.zcount(keys.leases, "-inf", now)
        pipe.hgetall(keys.counters)
        cursor = self._cursors[self.store.parts.index(keys)]
        if cursor is None:
            # First scrape: start at the stream's end. Old events would land
            # in one scrape as a burst that no rate() can place in time.
            pipe.xrevrange(keys.events, count=1)
        else:
            pipe.xrange(keys.events, min=f"({cursor}", count=EVENTS_PER_SCRAPE)
        pipe.zcard(keys.http_schedule)
        pipe.zcount(keys.http_schedule, "-inf", now)
        pipe.hgetall(keys.queue_in_flight)
        pipe.hgetall(keys.queue_held)
        pipe.hrandfield(keys.state, recrawl.SAMPLE, withvalues=True)

    def _advance(self, part: int, events: Sequence[tuple[str, dict[str, str]]]) -> None:
        """Move partition ``part``'s cursor past ``events``, observing their start lag."""
        if self._cursors[part] is None:
            self._cursors[part] = str(events[0][0]) if events else "0-0"
            return
        for event_id, fields in events:
            self._cursors[part] = str(event_id)
            lag = _start_lag_s(fields)
            if lag is not None:
                self.start_lag.observe(lag)

    # ------------------------------------------------------------ families
    @staticmethod
    def _job_families(totals: dict[str, int], oldest_age_ms: int) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("zsched_jobs", "Jobs by state.", labels=["state"])
        for state in STATES:
            jobs.add_metric([state], totals[state])
        yield jobs
        yield GaugeMetricFamily("zsched_job_definitions", "Job definitions stored.",
                                value=totals["defs"])
        yield GaugeMetricFamily("zsched_due_backlog", "Jobs due now and not yet claimed.",
                                value=totals["due"])
        yield GaugeMetricFamily("zsched_http_due_backlog",
                                "HTTP jobs (transport http) due now and not yet taken by a "
                                "worker of the job gateway.", value=totals["http_due"])
        yield GaugeMetricFamily("zsched_due_oldest_age_seconds",
                                "How long the oldest due, unclaimed job has been due (0: none).",
                                value=oldest_age_ms / 1000.0)
        yield GaugeMetricFamily("zsched_in_flight",
                                "Occurrences published and not settled (queued plus running).",
                                value=totals["queued"] + totals["running"])
        yield GaugeMetricFamily("zsched_leases_expired",
                                "Running occurrences past their lease deadline, not reaped yet.",
                                value=totals["expired"])
        yield GaugeMetricFamily("zsched_dead_letters", "Dead letters waiting for an operator.",
                                value=totals["dead"])

    def _queue_families(self, queues: dict[str, list[int]]) -> Iterator[Metric]:
        settings = self.store.settings
        flight = GaugeMetricFamily(
            "zsched_queue_in_flight",
            "Occurrences of a queue published and not started (its backpressure count; "
            'queue "": jobs that name none).', labels=["queue"])
        held = GaugeMetricFamily(
            "zsched_queue_held_back",
            "Due jobs of a queue held back in the schedule because the queue was at its "
            "bound.", labels=["queue"])
        for queue, (n_flight, n_held) in sorted(queues.items()):
            flight.add_metric([queue], n_flight)
            held.add_metric([queue], n_held)
        yield from (flight, held)
        yield GaugeMetricFamily("zsched_queue_bound",
                                "Most occurrences of one queue published and not started.",
                                value=settings.queue_bound)
        yield GaugeMetricFamily("zsched_queued_cap",
                                "Most occurrences published and not started, all queues.",
                                value=settings.queued_bound)

    @staticmethod
    def _outbox_families(report: OutboxReport) -> Iterator[Metric]:
        # Written by the Django app's outbox sweeper (in beat); 0 without Django.
        yield GaugeMetricFamily("zsched_outbox_pending",
                                "Job changes saved in the Django database and not in Redis yet.",
                                value=report.pending)
        yield GaugeMetricFamily("zsched_outbox_oldest_age_seconds",
                                "Age of the oldest change not in Redis yet (0: none), on "
                                "Redis' clock since the sweeper's last report.",
                                value=report.oldest_age_now_ms / 1000.0)
        yield GaugeMetricFamily("zsched_outbox_dead",
                                "Job changes dead-lettered by the outbox after "
                                "zsched_outbox_max_attempts failed pushes.", value=report.dead)

    @staticmethod
    def _counter_families(counters: dict[str, int]) -> Iterator[Metric]:
        settles = CounterMetricFamily("zsched_settles", "Settled occurrences by outcome.",
                                      labels=["outcome"])
        for outcome in OUTCOMES:
            settles.add_metric([outcome], counters.get(outcome, 0))
        yield settles
        for key, name, doc in COUNTERS:
            yield CounterMetricFamily(name, doc, value=counters.get(key, 0))

    def _domain_families(self, domains: Sequence[DomainInfo]) -> Iterator[Metric]:
        throttled = [d for d in domains if d.throttled]
        open_ = [d for d in domains if d.breaker != "closed"]
        yield GaugeMetricFamily("zsched_domains", "Domains with pacing state or an override.",
                                value=len(domains))
        yield GaugeMetricFamily("zsched_domains_throttled",
                                "Domains slower than configured now (raised delay or gate).",
                                value=len(throttled))
        yield GaugeMetricFamily("zsched_domains_breaker_open",
                                "Domains whose breaker is open or half-open.", value=len(open_))
        # Per-domain series only for the worst few: an open breaker first, then
        # the longest delay. The label set stays bounded however many domains.
        worst = sorted({d.name: d for d in [*open_, *throttled]}.values(),
                       key=lambda d: (d.breaker == "closed", -d.delay_s, d.name))
        worst = worst[:self.top_domains]
        delay = GaugeMetricFamily("zsched_domain_delay_seconds",
                                  "Delay in force of the top throttled or open domains.",
                                  labels=["domain"])
        in_flight = GaugeMetricFamily("zsched_domain_in_flight",
                                      "In flight of the top throttled or open domains.",
                                      labels=["domain"])
        breaker = GaugeMetricFamily("zsched_domain_breaker_open",
                                    "1 if the breaker of a top domain is not closed.",
                                    labels=["domain"])
        for d in worst:
            delay.add_metric([d.name], d.delay_s)
            in_flight.add_metric([d.name], d.in_flight)
            breaker.add_metric([d.name], int(d.breaker != "closed"))
        yield from (delay, in_flight, breaker)

    def _planner_families(self, plans: Sequence[DomainPlan], now_ms: int,
                          demand: planner.Demand | None) -> Iterator[Metric]:
        # Before the first scan finished (demand None), no domain is known to be over.
        over = [p for p in plans if p.oversubscribed]
        yield GaugeMetricFamily("zsched_domains_oversubscribed",
                                "Domains whose jobs ask for more fetches a day than their "
                                "pacing allows (capacity planner).", value=len(over))
        if demand is not None:
            yield GaugeMetricFamily(
                "zsched_planner_age_seconds",
                "Age of the capacity planner's last scan of the schedule.",
                value=max(0, now_ms - demand.computed_ms) / 1000.0)
        # The highest ratios only: the label set stays bounded however many domains.
        top = sorted(plans, key=lambda p: (-p.ratio, p.name))[:self.top_domains]
        ratio = GaugeMetricFamily("zsched_domain_demand_ratio",
                                  "Fetches a day a domain's jobs ask for over those its pacing "
                                  "allows (>1: over-subscribed), for the top domains.",
                                  labels=["domain"])
        lateness = GaugeMetricFamily("zsched_domain_lateness_seconds",
                                     "Estimated lateness of each run of an over-subscribed "
                                     "domain (steady state; 0 when it keeps up).",
                                     labels=["domain"])
        for p in top:
            ratio.add_metric([p.name], p.ratio)
            lateness.add_metric([p.name], p.lateness_s)
        yield from (ratio, lateness)


def _start_lag_s(fields: dict[str, str]) -> float | None:
    """Start minus due (s) of a settle event, or None when it never started (a misfire)."""
    try:
        data = json.loads(fields.get("data") or "{}")
        started, due = data.get("started_ms"), data.get("due_ms")
        if started is None or due is None:
            return None
        return max(0.0, (int(started) - int(due)) / 1000.0)
    except (ValueError, TypeError, AttributeError):
        return None  # an event some other version wrote: skip it, never fail the scrape


def serve(store: Store, port: int, addr: str = "127.0.0.1",
          top_domains: int = 10) -> tuple[Any, threading.Thread]:
    """Serve ``/metrics`` of ``store`` on ``addr:port`` in a daemon thread.

    Returns the server (``shutdown()`` stops it) and its thread. The registry is
    a dedicated one: the exporter shows the store, not this process.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, top_domains))
    return start_http_server(port, addr, registry=registry)
