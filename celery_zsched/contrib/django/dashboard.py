"""The "Dashboard" page of the admin: due load, lateness, outcomes, states and alerts as SVG.

Every figure comes from a read whose cost is bounded whatever the fleet size:

* **due load** over the next 24 hours: :data:`DUE_BUCKETS` + 1 ``ZCOUNT``\\ s per
  partition (twice that when HTTP jobs wait: their schedules too), pipelined in
  one round trip (:meth:`Store.due_counts`), never a scan;
* **lateness p50/p99 and outcomes per hour** over the last :data:`HOURS` hours:
  two SQL statements on :class:`ZSchedRun` that read only the covering index
  ``zsched_run_window`` (finished_at, status, lateness_ms), never the table
  rows: per-hour outcome counts, then each percentile, exact (nearest rank),
  as one ``ORDER BY lateness_ms LIMIT 1 OFFSET k`` per hour. Only counts and
  2 values per hour come back, not the window's runs.
  Without history in the window they are computed from the newest
  :data:`STREAM_SAMPLE` entries of the Redis settle stream instead;
* **jobs by state** and the dead-letter count: the counters of :meth:`Store.stats`;
* **throttled domains and open breakers** (with pacing on): :meth:`Store.domain_alerts`;
* **over-subscribed domains** (with pacing on): the capacity planner's last result
  (:mod:`celery_zsched.services.planner`; a scan of the definitions only when it is due);
* **changes not in Redis yet** (the outbox): one query over the outbox table
  (:func:`.outbox.status`), with a warning when the oldest is older than
  ``zsched_outbox_warn_s`` or some are dead-lettered; shown when Redis is down too.

The view is a plain admin view under the job admin's URLs
(``.../zschedjob/dashboard/``), guarded by its view permission like the
Domains and Dead letters pages.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone as dj_timezone
from django.utils.safestring import SafeString, mark_safe

from celery_zsched.contrib.django import outbox, svg
from celery_zsched.contrib.django.conf import get_store
from celery_zsched.contrib.django.freshness_chart import SAMPLE, freshness_figures
from celery_zsched.contrib.django.models import ZSchedRun
from celery_zsched.contrib.django.stats import percentile
from celery_zsched.core import domain_table
from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.core.planner import DomainPlan
from celery_zsched.core.state import RuntimeState
from celery_zsched.core.timing import ms_to_dt
from celery_zsched.services import planner
from celery_zsched.store import Store
from celery_zsched.store.errors import redis_unavailable

#: Due-load histogram: 48 half-hour buckets cover the next 24 hours.
DUE_BUCKETS = 48
DUE_BUCKET_MS = 30 * 60_000
#: Hours of lateness and outcome history shown, the current (partial) hour last.
HOURS = 24
#: The percentiles of the lateness chart.
PERCENTILES = (50, 99)
#: Newest settle events read when run history has nothing in the window.
STREAM_SAMPLE = 10_000
#: Dead-letter ids and domain names listed by name on the page.
LISTED = 10

#: Outcome colours (the labels of RunStatus), in stacking order: the admin's badges too.
OUTCOME_COLOURS: dict[str, str] = {
    "complete": "#2e7d32",
    "retrying": "#ef6c00",
    "error": "#c62828",
    "skipped": "#607d8b",
    "blocked_by_robots": "#6a1b9a",
}
STATE_COLOURS = {"scheduled": "#417690", "queued": "#79aec8", "running": "#2e7d32",
                 "paused": "#9e9e9e", "dead": "#c62828"}


@dataclass(frozen=True)
class DueLoad:
    """Scheduled jobs already overdue, then per :data:`DUE_BUCKET_MS` bucket from ``now_ms``."""

    now_ms: int
    overdue: int
    counts: list[int]


@dataclass
class Hour:
    """One hour of settles: how many, lateness percentiles (ms) and outcome counts."""

    start: datetime
    runs: int = 0
    lateness: dict[int, int | None] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RunWindow:
    """The last :data:`HOURS` hours of settles, and where they were read."""

    hours: list[Hour]
    source: str


@dataclass(frozen=True)
class Dashboard:
    """Everything the page shows."""

    due: DueLoad
    runs: RunWindow
    stats: dict[str, int]
    dead_ids: list[str]
    alerts: dict[str, list[str]] | None
    #: A random sample of runtime states, for the freshness chart.
    sample: list[RuntimeState]
    #: The capacity planner's over-subscribed domains, highest demand ratio first.
    oversubscribed: list[DomainPlan] = field(default_factory=list)


# ------------------------------------------------------------------ gathering
def gather(store: Store, hours: int = HOURS) -> Dashboard:
    """Read every figure of the page (Redis and database), at bounded cost.

    Raises :class:`~celery_zsched.core.errors.StoreUnavailable` if Redis is down.
    """
    with redis_unavailable():
        now = store.now_ms()
        stats = store.stats()
        return Dashboard(
            due=due_load(store, now, http=bool(stats.get("http_scheduled"))),
            runs=run_window(store, now, hours), stats=stats,
            dead_ids=store.dead_ids(LISTED) if stats.get("dead") else [],
            alerts=store.domain_alerts() if store.settings.pacing else None,
            oversubscribed=_oversubscribed(store) if store.settings.pacing else [],
            sample=store.sample_states(SAMPLE))


def _oversubscribed(store: Store) -> list[DomainPlan]:
    # The planner's last result (a scan only when it is due: see services.planner).
    _infos, plans, _demand = planner.domain_plans(store)
    return sorted((p for p in plans.values() if p.oversubscribed),
                  key=lambda p: (-p.ratio, p.name))


def due_load(store: Store, now_ms: int, *, http: bool = False) -> DueLoad:
    """The due-load histogram: one pipelined batch of ZCOUNTs per partition.

    ``http``: HTTP jobs wait (``stats()["http_scheduled"]``), so their schedules
    are counted too; a store without any pays nothing for them.
    """
    edges = [now_ms + i * DUE_BUCKET_MS for i in range(DUE_BUCKETS + 1)]
    counts = store.due_counts(edges, http=http)
    return DueLoad(now_ms=now_ms, overdue=counts[0], counts=counts[1:])


def hour_starts(now_ms: int, hours: int) -> list[datetime]:
    """Start of each of the last ``hours`` clock hours (UTC), the one holding ``now_ms`` last."""
    current = ms_to_dt(now_ms).replace(minute=0, second=0, microsecond=0)
    return [current - timedelta(hours=hours - 1 - i) for i in range(hours)]


def run_window(store: Store, now_ms: int, hours: int = HOURS) -> RunWindow:
    """Settles per hour from run history, or from the settle stream when history has none."""
    starts = hour_starts(now_ms, hours)
    window = [Hour(start) for start in starts]
    if _from_history(window):
        return RunWindow(window, "run history")
    since = int(starts[0].timestamp() * 1000)
    events = store.recent_events(since, STREAM_SAMPLE)
    _from_events(window, events)
    source = (f"the newest {len(events):,} settle events" if len(events) >= STREAM_SAMPLE
              else "the settle stream")
    return RunWindow(window, source)


def _from_history(window: list[Hour]) -> bool:
    """Fill ``window`` from :class:`ZSchedRun`; ``False`` if it has no run there.

    Two statements, each a ``UNION ALL`` of one part per hour that reads one
    range of the covering index ``zsched_run_window`` and never the table:

    * outcome counts: ``GROUP BY status`` per hour (plain index-entry counting,
      no per-row expression);
    * each percentile, exactly (nearest rank ``ceil(p * n / 100)``), as
      ``ORDER BY lateness_ms LIMIT 1 OFFSET k`` per hour, from whichever end is
      nearer: the database keeps only ``k + 1`` values in its sorter, so a p99
      holds 1% of the hour. Sorting is the only work per run.

    Written as SQL rather than 72 ORM querysets: compiling those cost more than
    running them.
    """
    sql = _HistorySQL()
    bounds = [sql.bounds(hour) for hour in window]
    timed = [0] * len(window)
    with connection.cursor() as cursor:
        cursor.execute(*sql.counts(bounds))
        for index, status, runs, with_lateness in cursor.fetchall():
            hour = window[index]
            hour.outcomes[status] = hour.outcomes.get(status, 0) + runs
            hour.runs += runs
            timed[index] += with_lateness
        if not any(hour.runs for hour in window):
            return False
        wanted = [(i, p, n) for i, n in enumerate(timed) if n for p in PERCENTILES]
        if wanted:
            cursor.execute(*sql.percentiles(bounds, wanted))
            for index, pct, value in cursor.fetchall():
                window[index].lateness[pct] = int(value)
    return True


class _HistorySQL:
    """The statements of :func:`_from_history`, with names quoted by the backend."""

    def __init__(self) -> None:
        quote = connection.ops.quote_name
        meta = ZSchedRun._meta
        self.table = quote(meta.db_table)
        self.at, self.status, self.late = (quote(meta.get_field(name).column)
                                           for name in ("finished_at", "status", "lateness_ms"))

    def bounds(self, hour: Hour) -> list[Any]:
        adapt = connection.ops.adapt_datetimefield_value
        return [adapt(hour.start), adapt(hour.start + timedelta(hours=1))]

    def counts(self, bounds: list[list[Any]]) -> tuple[str, list[Any]]:
        parts = [f"SELECT {i}, {self.status}, COUNT(*), COUNT({self.late}) FROM {self.table} "
                 f"WHERE {self.at} >= %s AND {self.at} < %s GROUP BY {self.status}"
                 for i in range(len(bounds))]
        return " UNION ALL ".join(parts), [v for pair in bounds for v in pair]

    def percentiles(self, bounds: list[list[Any]], wanted: list[tuple[int, int, int]]
                    ) -> tuple[str, list[Any]]:
        parts, params = [], []
        for part, (index, pct, n) in enumerate(wanted):
            rank = max(1, -(-pct * n // 100))  # ceil(pct * n / 100), in integers
            order, offset = ("ASC", rank - 1) if rank - 1 <= n - rank else ("DESC", n - rank)
            parts.append(
                f"SELECT * FROM (SELECT {index}, {pct}, {self.late} FROM {self.table} "
                f"WHERE {self.at} >= %s AND {self.at} < %s AND {self.late} IS NOT NULL "
                f"ORDER BY {self.late} {order} LIMIT 1 OFFSET {offset}) AS p{part}")
            params += bounds[index]
        return " UNION ALL ".join(parts), params


def _from_events(window: list[Hour], events: Sequence[dict[str, str]]) -> None:
    starts = [int(hour.start.timestamp() * 1000) for hour in window]
    late: dict[int, list[int]] = defaultdict(list)
    for fields in events:
        try:
            at = int(fields.get("at") or 0)
            data = json.loads(fields.get("data") or "{}") or {}
        except ValueError:
            continue
        index = (at - starts[0]) // 3_600_000
        if not 0 <= index < len(window):
            continue
        hour = window[index]
        status = fields.get("status", "")
        hour.outcomes[status] = hour.outcomes.get(status, 0) + 1
        hour.runs += 1
        if isinstance(data, dict) and isinstance(data.get("lateness_ms"), int | float):
            late[index].append(int(data["lateness_ms"]))
    for index, values in late.items():
        values.sort()
        window[index].lateness = {p: percentile(values, p) for p in PERCENTILES}


# ------------------------------------------------------------------ rendering
def _clock(dt: datetime) -> str:
    return dj_timezone.localtime(dt).strftime("%H:%M")


def due_chart(due: DueLoad) -> str:
    """Overdue, then the next 24 h in half hours."""
    now = ms_to_dt(due.now_ms)
    step = timedelta(milliseconds=DUE_BUCKET_MS)
    # A label every 2 hours, on the bucket that starts there; "+0h" would crowd "late".
    labels = ["late"] + [f"+{i * DUE_BUCKET_MS // 3_600_000}h" if i % 4 == 0 and i else ""
                         for i in range(DUE_BUCKETS)]
    hovers = [f"{due.overdue:,} jobs overdue (due before now, not claimed yet)"] + [
        f"{n:,} jobs due {_clock(now + i * step)} to {_clock(now + (i + 1) * step)} "
        f"(in {i * 30} to {(i + 1) * 30} min)" for i, n in enumerate(due.counts)]
    total = due.overdue + sum(due.counts)
    peak = max(range(DUE_BUCKETS), key=lambda i: due.counts[i]) if due.counts else 0
    desc = (f"{total:,} jobs are due within 24 hours, {due.overdue:,} of them overdue; the "
            f"busiest half hour starts in {peak * 30} min with {due.counts[peak]:,} jobs.")
    return svg.bar_chart([due.overdue, *due.counts], labels, hovers,
                         title="Due load, next 24 hours", desc=desc, y_label="jobs",
                         x_label="half hours from now (the first bar: overdue)",
                         colours=["#c62828"], every=1)


def _hour_labels(window: RunWindow) -> list[str]:
    return [_clock(hour.start) if i % 3 == 0 else "" for i, hour in enumerate(window.hours)]


def lateness_chart(window: RunWindow) -> str:
    """Lateness p50 and p99 per hour (seconds)."""
    lines = [svg.Series(f"p{p}", [None if (v := h.lateness.get(p)) is None else v / 1000
                                  for h in window.hours], colour)
             for p, colour in zip(PERCENTILES, ("#417690", "#c62828"), strict=True)]
    worst = max((v for h in window.hours for v in h.lateness.values() if v is not None),
                default=None)
    desc = (f"Beat lateness (due to promote) per hour over the last {len(window.hours)} "
            f"hours, from {window.source}; " + (f"the worst hourly p99 is {worst / 1000:g} s."
                                                if worst is not None else "no runs."))
    labels = [_clock(h.start) for h in window.hours]
    return svg.line_chart(lines, labels, title="Lateness p50 / p99 per hour", desc=desc,
                          y_label="seconds", unit=" s", x_label="hour (local time)", every=3)


def outcomes_chart(window: RunWindow) -> str:
    """Settles per hour, stacked by outcome."""
    names = list(OUTCOME_COLOURS) + sorted({s for h in window.hours for s in h.outcomes}
                                           - set(OUTCOME_COLOURS))
    layers = [svg.Series(name, [h.outcomes.get(name, 0) for h in window.hours],
                         OUTCOME_COLOURS.get(name, "#795548")) for name in names]
    totals = {name: sum(h.outcomes.get(name, 0) for h in window.hours) for name in names}
    desc = (f"Settles per hour over the last {len(window.hours)} hours, from {window.source}: "
            + ", ".join(f"{n:,} {name}" for name, n in totals.items()) + ".")
    labels = [_clock(h.start) for h in window.hours]
    return svg.stacked_bars(layers, labels, title="Outcomes per hour", desc=desc,
                            y_label="settles", x_label="hour (local time)", every=3)


def states_chart(stats: dict[str, int]) -> str:
    """Jobs by state, from the store's counters."""
    names = list(STATE_COLOURS)
    values = [stats.get(name, 0) for name in names]
    desc = "Jobs by state: " + ", ".join(f"{v:,} {n}" for n, v in zip(names, values,
                                                                       strict=True)) + "."
    return svg.bar_chart(values, names, [f"{v:,} {n}" for n, v in zip(names, values,
                                                                       strict=True)],
                         title="Jobs by state", desc=desc, y_label="jobs",
                         colours=[STATE_COLOURS[n] for n in names], width=380)


# ----------------------------------------------------------------------- view
class DashboardAdminView:
    """The dashboard page, bound to the job admin whose view permission guards it."""

    def __init__(self, model_admin: Any) -> None:
        self.model_admin = model_admin
        self.site = model_admin.admin_site
        self.opts = model_admin.model._meta

    def urls(self) -> list[URLPattern]:
        return [path("dashboard/", self.site.admin_view(self.view),
                     name=f"{self.opts.app_label}_dashboard")]

    def _url(self, name: str, *args: str) -> str:
        return reverse(f"{self.site.name}:{self.opts.app_label}_{name}", args=args)

    def view(self, request: HttpRequest) -> HttpResponse:
        if not self.model_admin.has_view_or_change_permission(request):
            raise PermissionDenied
        context: dict[str, Any] = {
            **self.site.each_context(request), "title": "Scheduler dashboard",
            "opts": self.opts, "dead_url": self._url("dead_letters"),
            "domains_url": self._url("domains"), "error": "",
            # From the database alone: shown when Redis is down too, when it matters most.
            "outbox": outbox.status(),
            "outbox_url": self._url("zschedoutbox_changelist"),
        }
        try:
            context.update(self._charts(gather(get_store())))
        except StoreUnavailable as exc:
            context["error"] = str(exc)
        return TemplateResponse(request, "admin/zsched/dashboard.html", context)

    def _charts(self, data: Dashboard) -> dict[str, Any]:
        alerts = data.alerts
        domain_rows = {
            key: [(name, self._url("domain_change", name)) for name in names[:LISTED]]
            for key, names in (alerts or {}).items()}
        return {
            "due_svg": _safe(due_chart(data.due)),
            "lateness_svg": _safe(lateness_chart(data.runs)),
            "outcomes_svg": _safe(outcomes_chart(data.runs)),
            "states_svg": _safe(states_chart(data.stats)),
            **{k: _safe(v) if k.endswith("_svg") else v
               for k, v in freshness_figures(data.sample).items()},
            "stats": data.stats, "source": data.runs.source,
            "hours": [(h, h.lateness.get(50), h.lateness.get(99)) for h in data.runs.hours],
            "due_total": data.due.overdue + sum(data.due.counts),
            "dead_count": data.stats.get("dead", 0), "dead_ids": data.dead_ids,
            "pacing": alerts is not None, "domain_rows": domain_rows,
            "throttled_count": len((alerts or {}).get("throttled", [])),
            "breakers_count": len((alerts or {}).get("breakers_open", [])),
            "oversubscribed_count": len(data.oversubscribed),
            "oversubscribed_rows": [
                (p.name, self._url("domain_change", p.name), f"{p.ratio:.2f}x",
                 domain_table.lateness(p)) for p in data.oversubscribed[:LISTED]],
            "oversubscribed_url": self._url("domains") + "?over=1",
        }


def _safe(markup: str) -> SafeString:
    # svg.py escapes every text it is given; its output is markup by construction.
    return mark_safe(markup)
