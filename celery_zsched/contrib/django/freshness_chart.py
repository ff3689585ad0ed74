"""The dashboard's freshness chart: the fleet's current recrawl intervals, and its
estimated freshness and age (Cho), from a random sample of job states."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery_zsched.contrib.django import svg
from celery_zsched.core.recrawl import estimate
from celery_zsched.core.state import RuntimeState

#: Job states sampled per partition for the chart.
SAMPLE = 2000
#: (upper bound s, label) of the interval bars.
_BARS = ((60, "≤1m"), (300, "≤5m"), (900, "≤15m"), (3600, "≤1h"), (4 * 3600, "≤4h"),
         (86_400, "≤1d"), (7 * 86_400, "≤7d"), (float("inf"), ">7d"))


def freshness_figures(states: Sequence[RuntimeState]) -> dict[str, Any]:
    """The chart (SVG markup) and the figures beside it."""
    found = [e for e in map(estimate, states) if e is not None]
    counts = [0] * len(_BARS)
    for e in found:
        counts[next(i for i, (bound, _) in enumerate(_BARS) if e.interval_s <= bound)] += 1
    fresh = sum(e.freshness for e in found) / len(found) if found else None
    age = sum(e.age_s for e in found) / len(found) if found else None
    desc = (f"Current recrawl intervals of {len(found):,} sampled jobs whose visits report "
            "changes" + (f"; estimated fleet freshness {fresh:.0%}, mean age {age:,.0f} s."
                         if fresh is not None and age is not None else "."))
    labels = [label for _, label in _BARS]
    chart = svg.bar_chart(counts, labels, [f"{n:,} jobs {label}" for n, label in
                                           zip(counts, labels, strict=True)],
                          title="Recrawl intervals (sampled)", desc=desc, y_label="jobs",
                          x_label="current interval", width=380)
    return {"freshness_svg": chart, "fleet_freshness": fresh, "fleet_age_s": age,
            "freshness_sampled": len(states), "freshness_estimated": len(found)}
