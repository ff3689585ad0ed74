"""Cho and Garcia-Molina's budget allocation per domain (``zsched_recrawl_allocation``).

The capacity planner's scan collects each domain's adaptive pages that have a
change-rate estimate (:class:`Pages`); :func:`multipliers` solves, per paced
domain, the multiplier ``mu`` at which those pages' allocated intervals spend
the domain's budget: its capacity (one start per delay) less what its other jobs
(fixed ones, and adaptive ones with no estimate yet) ask for. ``settle.lua``
reads the domain's ``mu`` and turns a page's rate into its interval
(:func:`~celery_zsched.core.recrawl.allocation_interval_s`).

Pages are counted by (rate to 3 significant figures, bounds): a fleet has few
distinct bounds and the rates' rounding moves an interval by under 0.1%, so the
memory is that of the distinct triples, not the jobs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from celery_zsched.core.job import Job
from celery_zsched.core.planner import DAY_S, DomainPlan
from celery_zsched.core.recrawl import bounds_s, history_of, solve_mu_pages
from celery_zsched.core.state import RuntimeState

#: A budget at or below this (fetches a second) is none: every page gets its upper bound.
_NO_BUDGET = 1e-12


@dataclass
class Pages:
    """One domain's adaptive pages with an estimate, and the fetches a second they ask now."""

    pages: Counter[tuple[float, float, float]] = field(default_factory=Counter)
    per_s: float = 0.0

    def add(self, raw: str, state: RuntimeState, interval_s: float) -> None:
        """Count the adaptive job stored as ``raw`` if its history gives a rate."""
        rate = history_of(state).rate()
        if rate is None:
            return
        low, high = bounds_s(Job.from_json(raw))
        self.pages[(float(f"{rate:.3g}"), low, high)] += 1
        self.per_s += 1 / interval_s


def multipliers(pages: dict[str, Pages], plans: dict[str, DomainPlan]) -> dict[str, float]:
    """Each paced domain's ``mu`` for its ``pages``, within its plan's capacity."""
    mus: dict[str, float] = {}
    for name, mine in pages.items():
        domain = plans.get(name)
        if domain is None or domain.capacity_per_day is None:
            continue  # unpaced: no budget to share out
        others = (domain.demand_per_day - mine.per_s * DAY_S) / DAY_S
        budget = max(domain.capacity_per_day / DAY_S - others, _NO_BUDGET)
        mus[name] = solve_mu_pages(mine.pages, budget)
    return mus
