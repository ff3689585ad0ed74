"""The capacity planner over a store: scan the schedule, share the result, join it to pacing.

**Cost.** The demand side needs every definition: one HSCAN over the
definitions hash (pages of 2,000, with one SMISMEMBER each for the paused
flags, and one HMGET of the adaptive jobs' runtime states, whose interval
in force is there, in the same round trip) and a JSON parse per job, so
O(jobs) in time and O(domains) in memory.
It is therefore not done per call: the result (per domain: jobs, fetches a day,
and the histogram of intervals) is stored in Redis with the time it was
computed, and recomputed at most every ``zsched_planner_refresh_s`` (5 min), by
one process at a time (an expiring claim), while every other reader uses the
last result. The capacity side is the domains' live pacing, read at each call
(one HSCAN of the domains hash), so an operator's new delay shows at once.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from celery_zsched.core.domains import DomainInfo, domain_of, domain_sort_key, info_from
from celery_zsched.core.planner import DomainLoad, DomainPlan, demanded_interval, plan
from celery_zsched.core.state import RuntimeState
from celery_zsched.services.allocation import Pages, multipliers
from celery_zsched.store import Store

#: How long one scan may hold the claim before another process may take over (ms).
CLAIM_MS = 600_000


@dataclass(frozen=True)
class Demand:
    """The demand side: what the schedule asks of each domain, when it was computed."""

    computed_ms: int
    jobs: int
    scan_s: float
    loads: dict[str, DomainLoad]
    #: The scan's adaptive pages with a change-rate estimate, per domain (what
    #: Cho's allocation needs; not shared: only the scanning process allocates).
    pages: dict[str, Pages] = field(default_factory=dict, compare=False)

    def to_json(self) -> str:
        return json.dumps({"at": self.computed_ms, "jobs": self.jobs, "s": round(self.scan_s, 3),
                           "d": {k: v.to_json() for k, v in self.loads.items()}},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> Demand:
        data = json.loads(raw)
        return cls(int(data["at"]), int(data["jobs"]), float(data["s"]),
                   {k: DomainLoad.from_json(v) for k, v in data["d"].items()})


def scan(store: Store) -> Demand:
    """Sum every enabled job's demand per domain (one pass over the definitions)."""
    started = time.perf_counter()
    now = store.now_ms()
    registrable = store.settings.domain_registrable
    loads: dict[str, DomainLoad] = defaultdict(DomainLoad)
    pages: dict[str, Pages] = defaultdict(Pages)
    jobs = 0
    for page in store.scan_definitions():
        for raw, paused, state in page:
            if paused:
                continue
            fields: dict[str, Any] = json.loads(raw)
            end_at = fields.get("end_at")
            if end_at is not None and end_at <= now:
                continue
            runtime = RuntimeState.from_wire(state) if state else None
            interval = demanded_interval(fields, runtime)
            if not interval:
                continue
            try:
                explicit = fields.get("domain")
                name = (domain_of(None, explicit) if explicit
                        else _domain_of_url(fields.get("url"), registrable))
            except ValueError:
                continue  # stored before its host was checked: not paced either
            if name is None:
                continue
            loads[name].add(interval)
            jobs += 1
            if runtime is not None:
                pages[name].add(raw, runtime, interval)
    return Demand(now, jobs, time.perf_counter() - started, dict(loads),
                  {k: v for k, v in pages.items() if v.pages})


def shared(store: Store) -> tuple[Demand | None, bool]:
    """The last result any process stored, and whether it is due for a new scan."""
    raw, now = store.planner_read()
    cached = Demand.from_json(raw) if raw else None
    due = cached is None or now - cached.computed_ms >= store.settings.planner_refresh_s * 1000
    return cached, due


def _domain_of_url(url: str | None, registrable: bool) -> str | None:
    """:func:`domain_of` of a job's URL; the URL's authority is cut out with string
    operations and its domain cached: a fleet has far fewer hosts than jobs, and
    ``urlsplit`` per job was most of a scan."""
    if not url:
        return None
    scheme_end = url.find("://")
    if scheme_end < 0:
        return domain_of(url, group_registrable=registrable)
    rest = url[scheme_end + 3:]
    for stop in "/?#":
        cut = rest.find(stop)
        if cut >= 0:
            rest = rest[:cut]
    return _domain_of_authority(url[:scheme_end], rest, registrable)


@lru_cache(maxsize=65536)
def _domain_of_authority(scheme: str, authority: str, registrable: bool) -> str | None:
    return domain_of(f"{scheme}://{authority}/", group_registrable=registrable)


def demand(store: Store, *, fresh: bool = False) -> Demand:
    """The demand side: the shared result while it is younger than
    ``zsched_planner_refresh_s``, else a new scan (``fresh``: a new scan now)."""
    cached, due = shared(store)
    if cached is not None and not fresh:
        if not due:
            return cached
        if not store.planner_claim(CLAIM_MS):
            return cached  # another process is scanning: its result comes soon
    elif not fresh:
        store.planner_claim(CLAIM_MS)  # nothing to share yet: this caller scans anyway
    result = scan(store)
    store.planner_write(result.to_json())
    if store.settings.recrawl_allocation:
        plans = domain_plans(store, result=result)[1]
        store.recrawl_mu_write(multipliers(result.pages, plans))
    return result


def domain_plans(store: Store, infos: list[DomainInfo] | None = None, *,
                 fresh: bool = False, result: Demand | None = None
                 ) -> tuple[list[DomainInfo], dict[str, DomainPlan], Demand]:
    """Every domain with pacing state, an override or jobs (sorted), each one's plan,
    and the demand it came from. ``infos``: the pacing already read, if it was;
    ``result``: the demand to use (default: :func:`demand`)."""
    infos = store.domains() if infos is None else infos
    result = demand(store, fresh=fresh) if result is None else result
    known = {i.name for i in infos}
    missing = [name for name in result.loads if name not in known]
    if missing:
        now = infos[0].now_ms if infos else store.now_ms()
        defaults = store.settings.pacing_defaults
        infos = sorted([*infos, *(info_from(n, None, None, defaults, now) for n in missing)],
                       key=lambda i: domain_sort_key(i.name))
    plans = {i.name: plan(i.name, result.loads[i.name], i.delay_s)
             for i in infos if i.name in result.loads}
    return infos, plans, result
