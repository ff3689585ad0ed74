"""The columns of the domain listing, shared by ``zsched domains`` and the Django admin.

Both surfaces show the same cells, so an operator reading one can trust the
other. Times are shown relative to the Redis clock the state was read with
(:attr:`DomainInfo.now_ms`), never the local one: gates and breakers run on
Redis time, and a skewed web server must not make an open gate look closed.
"""

from __future__ import annotations

from collections.abc import Mapping

from celery_zsched.core.domains import DomainInfo
from celery_zsched.core.planner import DomainPlan
from celery_zsched.core.timing import ms_to_dt

#: Header of each column, in order.
HEADERS: tuple[str, ...] = (
    "DOMAIN", "DELAY NOW/CONF", "DELAY FROM", "IN FLIGHT/CAP", "BREAKER", "CLOSED UNTIL",
    "LAST 429", "COMPLETED", "FAILED", "429S", "HELD", "OVERRIDE", "DEMAND/CAPACITY A DAY",
    "LATENESS",
)


def seconds(value: float) -> str:
    """``1.5s``, ``0s``, ``300s``: short and exact enough for a delay."""
    return f"{value:.3g}s" if value < 1000 else f"{value:.0f}s"


def span(ms: int) -> str:
    """A duration as ``450ms``, ``12s``, ``3m 5s``, ``2h 4m`` or ``3d 1h``."""
    ms = abs(ms)
    if ms < 1000:
        return f"{ms}ms"
    total = ms // 1000
    for unit, size, sub_unit, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60),
                                           ("m", 60, "s", 1)):
        if total >= size:
            rest = total % size // sub_size
            return f"{total // size}{unit}" + (f" {rest}{sub_unit}" if rest else "")
    return f"{total}s"


def until(ms: int | None, now_ms: int) -> str:
    """``in 12s`` for a time ahead of ``now_ms``; ``-`` when there is none."""
    if ms is None:
        return "-"
    return f"in {span(ms - now_ms)}" if ms > now_ms else "now"


def ago(ms: int | None, now_ms: int) -> str:
    """``12s ago`` for a past time; ``-`` when there is none."""
    if ms is None:
        return "-"
    return f"{span(now_ms - ms)} ago" if ms < now_ms else "now"


def iso(ms: int | None) -> str | None:
    """An absolute time for JSON output (UTC, ``Z``), or ``None``."""
    if ms is None:
        return None
    return ms_to_dt(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def cap(info: DomainInfo) -> str:
    """``2/3``, or ``2/unlimited`` for a cap of 0."""
    return f"{info.in_flight}/{info.max_in_flight or 'unlimited'}"


def delay(info: DomainInfo) -> str:
    """``4s/1s``: the delay in force (raised by 429s) over the configured one."""
    return f"{seconds(info.delay_s)}/{seconds(info.base_delay_s)}"


def breaker(info: DomainInfo) -> str:
    """``closed``, ``half-open`` or ``open, in 25s`` (the end of its cool-down)."""
    if info.breaker == "open" and info.breaker_until_ms is not None:
        return f"open, {until(info.breaker_until_ms, info.now_ms)}"
    return info.breaker


def override(info: DomainInfo) -> str:
    """What the per-domain override changes in kind: ``-``, ``yes`` or ``yes, fixed``."""
    if not info.overridden:
        return "-"
    return "yes" if info.adaptive else "yes, fixed"


def count(value: float) -> str:
    """``950``, ``12.5k``, ``3.2M``: a number of fetches, short."""
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}" if value < 10 else f"{value:.0f}"


def demand(plan: DomainPlan | None) -> str:
    """``12k/86.4k (14%)``, ``OVER 1.4x: 121k/86.4k``, ``950/unlimited``, or ``-`` (no jobs)."""
    if plan is None:
        return "-"
    if plan.capacity_per_day is None:
        return f"{count(plan.demand_per_day)}/unlimited"
    cells = f"{count(plan.demand_per_day)}/{count(plan.capacity_per_day)}"
    if plan.oversubscribed:
        return f"OVER {plan.ratio:.2f}x: {cells}"
    return f"{cells} ({plan.ratio:.0%})"


def lateness(plan: DomainPlan | None) -> str:
    """``~3m 20s`` per run when over-subscribed, else ``-``."""
    if plan is None or not plan.oversubscribed:
        return "-"
    return f"~{span(round(plan.lateness_s * 1000))}"


def row(info: DomainInfo, plan: DomainPlan | None = None) -> tuple[str, ...]:
    """The cells of one domain, in the order of :data:`HEADERS`."""
    return (
        info.name, delay(info), info.delay_source, cap(info), breaker(info),
        until(info.closed_until_ms, info.now_ms), ago(info.last_429_ms, info.now_ms),
        str(info.completed), str(info.failed), str(info.throttled_429), str(info.held),
        override(info), demand(plan), lateness(plan),
    )


def as_json(info: DomainInfo, plan: DomainPlan | None = None) -> dict[str, object]:
    """``info.as_dict()`` plus the times as ISO strings and the plan, for ``--json``."""
    out: dict[str, object] = dict(info.as_dict())
    for key in ("breaker_until_ms", "closed_until_ms", "last_429_ms"):
        value = out.get(key)
        out[key.removesuffix("_ms")] = iso(value if isinstance(value, int) else None)
    out["plan"] = plan.as_dict() if plan is not None else None
    return out


def render(infos: list[DomainInfo],
           plans: Mapping[str, DomainPlan] | None = None) -> list[str]:
    """The listing as aligned text lines, header first."""
    plans = plans or {}
    rows = [HEADERS, *(row(info, plans.get(info.name)) for info in infos)]
    widths = [max(len(r[col]) for r in rows) for col in range(len(HEADERS))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=True)).rstrip()
            for r in rows]
