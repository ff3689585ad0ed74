"""The capacity planner: what each domain's jobs ask for against what its pacing allows.

From the schedule alone. A job asks for ``86,400 / interval`` fetches a day
(:func:`demanded_interval`); a domain's **demand** is the sum over its jobs.
Pacing starts one request per ``delay`` at most, whatever the cap (the cap
bounds how many run at once, not how often one starts), so a domain's
**capacity** is ``86,400 / delay`` fetches a day (unlimited at a zero delay).
Their quotient is the **demand ratio**; above 1 the domain is over-subscribed.

**Lateness.** An over-subscribed domain serves its jobs one slot per delay,
and each job's next run is counted from its last settle, so every job's
cycle stretches from its interval ``I`` to ``I + W`` until the domain keeps
up: ``W`` solves ``sum(n_I / (I + W)) = capacity`` over the domain's intervals
(``n_I`` jobs of interval ``I``). ``W`` is how late each run will be, in the
steady state, and what the planner reports: ``interval * (ratio - 1)`` when the
domain's jobs share one interval. At a ratio up to 1, pacing only spreads runs
that fall due together, by up to a delay each: the planner reports 0.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_zsched.core.job import Job
from celery_zsched.core.recrawl import current_interval_s
from celery_zsched.core.state import RuntimeState
from celery_zsched.core.timing import cron_slot_after

DAY_S = 86_400.0
#: Distinct intervals kept per domain for the lateness estimate; more are
#: rounded onto the nearest kept ones (only the estimate's precision suffers).
MAX_INTERVALS = 64
#: Cron fires are counted over this many days (a week covers day-of-week rules).
_CRON_DAYS = 7
#: Most fires counted (an every-minute cron fires 10,080 times a week): past it the
#: spacing is the time those took over their number.
_CRON_MAX_FIRES = 2_000
_cron_cache: dict[tuple[str, str, str], float | None] = {}


def demanded_interval(job: Job | Mapping[str, Any],
                      state: RuntimeState | None = None) -> float | None:
    """Seconds between two fetches ``job`` asks for, or ``None`` (a one-off job).

    ``job``: a :class:`Job`, or the fields of a stored definition as the planner's
    scan reads them (parsing each into a ``Job`` would double the scan's cost).
    Interval jobs: the interval in force (:func:`~celery_zsched.core.recrawl.current_interval_s`:
    an adaptive job's, from its runtime ``state``, is the one its last settle chose;
    without one yet, its fixed ``interval_s``). Cron jobs: a day over their fires a
    day, averaged over a week.
    """
    if isinstance(job, Job):
        fields: Mapping[str, Any] = vars(job)
        interval = current_interval_s(job, state) if job.kind == "interval" else None
    else:
        fields = job
        interval = fields.get("interval_s")
        # The mapping's mirror of current_interval_s: only its recrawl and interval
        # fields matter, and the scan does not parse the definition into a Job.
        if (interval and fields.get("recrawl") == "adaptive" and state is not None
                and state.recrawl_interval_ms):
            interval = state.recrawl_interval_ms / 1000
    if interval:
        return float(interval)
    cron = fields.get("cron")
    if cron:
        return _cron_spacing(str(cron), str(fields.get("timezone") or "UTC"),
                             str(fields.get("day_rule") or "or"))
    return None


def _cron_spacing(cron: str, timezone: str, day_rule: str) -> float | None:
    # Fleets share a few cron strings: each is counted once per process.
    key = (cron, timezone, day_rule)
    if key not in _cron_cache:
        start = at = 1_767_225_600_000  # 2026-01-01T00:00Z: any fixed week will do
        end = start + int(_CRON_DAYS * DAY_S * 1000)
        fires = 0
        while True:
            after = cron_slot_after(cron, timezone, at, day_rule)
            if after > end:
                break
            at, fires = after, fires + 1
            if fires >= _CRON_MAX_FIRES:  # a frequent cron: its first fires tell enough
                end = at
                break
        _cron_cache[key] = ((end - start) / 1000 / fires) if fires else None
    return _cron_cache[key]


@dataclass
class DomainLoad:
    """One domain's jobs, as the scan sums them."""

    jobs: int = 0
    #: Fetches a day its jobs ask for.
    demand: float = 0.0
    #: Interval (s) -> jobs with it.
    intervals: Counter[float] = field(default_factory=Counter)

    def add(self, interval_s: float) -> None:
        """Count one job asking for a fetch every ``interval_s``."""
        self.jobs += 1
        self.demand += DAY_S / interval_s
        key = float(f"{interval_s:.3g}")
        if key not in self.intervals and len(self.intervals) >= MAX_INTERVALS:
            key = min(self.intervals, key=lambda kept: abs(math.log(kept / interval_s)))
        self.intervals[key] += 1

    def to_json(self) -> list[Any]:
        """Compact JSON: ``[jobs, demand, [[interval, jobs], ...]]``."""
        return [self.jobs, round(self.demand, 3), sorted(self.intervals.items())]

    @classmethod
    def from_json(cls, data: list[Any]) -> DomainLoad:
        """The inverse of :meth:`to_json`."""
        jobs, demand, intervals = data
        return cls(int(jobs), float(demand), Counter({float(i): int(n) for i, n in intervals}))


@dataclass(frozen=True)
class DomainPlan:
    """One domain's demand against its capacity."""

    name: str
    jobs: int
    #: Fetches a day its jobs ask for.
    demand_per_day: float
    #: Fetches a day its pacing allows (``None``: unlimited, a zero delay).
    capacity_per_day: float | None
    #: Demand over capacity (0 when unlimited).
    ratio: float
    #: Steady-state lateness of each run when over-subscribed (s; 0 otherwise).
    lateness_s: float

    @property
    def oversubscribed(self) -> bool:
        """Its jobs ask for more fetches than its pacing allows."""
        return self.ratio > 1.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict, with ``oversubscribed``."""
        return {"jobs": self.jobs, "demand_per_day": round(self.demand_per_day, 3),
                "capacity_per_day": (None if self.capacity_per_day is None
                                     else round(self.capacity_per_day, 3)),
                "demand_ratio": round(self.ratio, 4), "lateness_s": round(self.lateness_s, 1),
                "oversubscribed": self.oversubscribed}


def plan(name: str, load: DomainLoad, delay_s: float) -> DomainPlan:
    """``load`` against a domain paced at ``delay_s`` between two starts."""
    if delay_s <= 0:
        return DomainPlan(name, load.jobs, load.demand, None, 0.0, 0.0)
    capacity = DAY_S / delay_s
    ratio = load.demand / capacity
    lateness = _lateness_s(load.intervals, 1.0 / delay_s) if ratio > 1 else 0.0
    return DomainPlan(name, load.jobs, load.demand, capacity, ratio, lateness)


def _lateness_s(intervals: Counter[float], per_s: float) -> float:
    """``W`` with ``sum(n / (I + W)) == per_s``: the left side falls as ``W`` grows."""
    def served(wait: float) -> float:
        return sum(n / (i + wait) for i, n in intervals.items())
    low, high = 0.0, 1.0
    while served(high) > per_s:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if served(mid) > per_s else (low, mid)
    return high
