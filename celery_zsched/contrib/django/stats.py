"""Fleet statistics for ``zsched_stats``: Redis counts, database counts, lateness percentiles."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db.models import Count
from django.utils import timezone as dj_timezone

from celery_zsched.contrib.django import outbox
from celery_zsched.contrib.django.conf import get_store
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedRun
from celery_zsched.store import Store
from celery_zsched.store.errors import redis_unavailable

#: Most recent runs (or stream entries) the percentiles are computed from.
SAMPLE = 100_000
PERCENTILES = (50, 95, 99)
#: Domain names listed per alert before "... and N more".
LISTED = 50


def percentile(sorted_values: Sequence[int], pct: float) -> int | None:
    """Nearest-rank percentile of an ascending sequence (``None`` when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def summarize(values: list[int]) -> dict[str, int | None]:
    """``{"p50": …, "p95": …, "p99": …, "max": …}`` of ``values`` (sorted in place)."""
    values.sort()
    out: dict[str, int | None] = {f"p{p}": percentile(values, p) for p in PERCENTILES}
    out["max"] = values[-1] if values else None
    return out


def collect(window_minutes: int = 60, dead_sample: int = 10) -> dict[str, Any]:
    """Everything ``zsched_stats`` shows, as JSON-ready data.

    * ``redis``: jobs by state (scheduled, in flight, paused, dead), due now,
      in the next minute and hour, lifetime settle counters;
    * ``database``: rows in total, enabled, by kind;
    * ``lateness_ms`` / ``wait_ms`` / ``duration_ms``: p50/p95/p99/max over the
      runs of the last ``window_minutes`` (at most :data:`SAMPLE` of them),
      from run history, or from the Redis event stream when none was drained;
    * ``dead_letters``: how many, and the most recent ids;
    * ``domains`` (with ``zsched_pacing`` on): the names of the throttled
      domains and of those whose breaker is not closed;
    * ``outbox``: changes saved in the database and not in Redis yet (pending,
      dead-lettered, the oldest one's age) and a warning past
      ``zsched_outbox_warn_s`` (see :func:`.outbox.status`).

    Raises :class:`~celery_zsched.core.errors.StoreUnavailable` if Redis is down.
    """
    store = get_store()
    pending = outbox.status()
    with redis_unavailable():
        out = _collect(store, window_minutes, dead_sample)
    out["outbox"] = pending.as_dict()
    return out


def _collect(store: Store, window_minutes: int, dead_sample: int) -> dict[str, Any]:
    out: dict[str, Any] = {"redis": store.stats()}
    by_kind = dict(ZSchedJob.objects.values_list("kind").annotate(n=Count("pk"))
                   .values_list("kind", "n"))
    out["database"] = {
        "jobs": ZSchedJob.objects.count(),
        "enabled": ZSchedJob.objects.filter(enabled=True).count(),
        "by_kind": by_kind,
        "runs": ZSchedRun.objects.count(),
    }
    since = dj_timezone.now() - timedelta(minutes=window_minutes)
    recent = list(ZSchedRun.objects.filter(finished_at__gte=since).order_by("-finished_at")
                  .values_list("lateness_ms", "wait_ms", "duration_ms")[:SAMPLE])
    source = "run history"
    if not recent:
        recent = _from_stream(store, store.now_ms() - window_minutes * 60_000)
        source = "event stream"
    out["window"] = {"minutes": window_minutes, "runs": len(recent), "source": source}
    for index, name in enumerate(("lateness_ms", "wait_ms", "duration_ms")):
        out[name] = summarize([int(v) for row in recent if (v := row[index]) is not None])
    out["dead_letters"] = {"count": out["redis"].get("dead", 0),
                           "recent": store.dead_ids(dead_sample)}
    if store.settings.pacing:  # off, no domain is paced: nothing to alert on
        out["domains"] = store.domain_alerts()
    return out


def _from_stream(store: Store, since_ms: int
                 ) -> list[tuple[int | None, int | None, int | None]]:
    rows: list[tuple[int | None, int | None, int | None]] = []
    for fields in store.recent_events(since_ms, SAMPLE):
        try:
            data = json.loads(fields.get("data") or "{}") or {}
        except ValueError:
            continue
        rows.append((data.get("lateness_ms"), data.get("wait_ms"), data.get("duration_ms")))
    return rows


def lines(stats: dict[str, Any]) -> list[str]:
    """``collect()``'s result as text."""
    redis_stats = stats["redis"]
    out = ["Redis:"]
    out += [f"  {k}: {v}" for k, v in redis_stats.items()]
    db = stats["database"]
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(db["by_kind"].items())) or "none"
    out += ["Database:", f"  jobs: {db['jobs']} (enabled {db['enabled']}; {kinds})",
            f"  run history rows: {db['runs']}"]
    window = stats["window"]
    out.append(f"Last {window['minutes']} min ({window['runs']} runs, from {window['source']}):")
    for name in ("lateness_ms", "wait_ms", "duration_ms"):
        values = ", ".join(f"{k} {'-' if v is None else v}" for k, v in stats[name].items())
        out.append(f"  {name}: {values}")
    dead = stats["dead_letters"]
    out.append(f"Dead letters: {dead['count']}"
               + (f" (latest: {', '.join(dead['recent'])})" if dead["recent"] else ""))
    if "domains" in stats:
        out += domain_lines(stats["domains"])
    if "outbox" in stats:
        out += outbox_lines(stats["outbox"])
    return out


def outbox_lines(state: dict[str, Any]) -> list[str]:
    """The outbox's counts, and its warning when there is one."""
    out = [f"Outbox (changes not in Redis yet): {state['pending']} pending"
           + (f" (oldest {state['oldest_age_s']:.0f} s)" if state["pending"] else "")
           + f", {state['dead']} dead-lettered"]
    if state.get("warning"):
        out.append(f"WARNING: {state['warning']}")
    return out


def domain_lines(alerts: dict[str, list[str]]) -> list[str]:
    """The throttled domains and open breakers, by name (at most :data:`LISTED` each)."""
    out = []
    for label, key in (("Throttled domains", "throttled"), ("Breakers open", "breakers_open")):
        names = alerts.get(key, [])
        listed = ", ".join(names[:LISTED])
        more = f" ... and {len(names) - LISTED} more" if len(names) > LISTED else ""
        out.append(f"{label}: {len(names)}" + (f" ({listed}{more})" if names else ""))
    return out
