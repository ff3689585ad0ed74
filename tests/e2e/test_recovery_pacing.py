"""Pacing under worker kills: no domain freezes, none is exceeded (issue 18).

The worker crash loop with pacing on: 5 domains (targets on loopback addresses
of their own), cap 2 in flight, 0.5 s apart, on the Redis broker, every other
timeout at its default. Occurrences a killed worker held count toward their
domain's cap until they land; before the hold, kombu's visibility timeout kept
them (and so the domain) for an hour. Proven at the targets and in Redis:

* 0 starts above a cap: no target ever has more than 2 requests in flight;
* every domain's jobs keep running: each job settles a run after the loop;
* no domain is left at its cap with nothing running: once beat stops and the
  last worker drains, every domain's in-flight count is back to 0.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from e2e.conftest import Deployment
from e2e.observe import SOAK, counters, report, states, wait_all, wait_ready
from e2e.targets import PacedTarget

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600 if SOAK else 600)]

DOMAINS = 5
JOBS_PER_DOMAIN = 20
CAP, DELAY_S = 2, 0.5
#: Each request is held longer than the delay, so a domain's requests overlap and
#: its cap, not its delay, is what limits it: 2 per 1.2 s, its 20 jobs in 12 s a round.
TASK_S = 1.2
INTERVAL_S = 20.0
KILLS = 20 if SOAK else 3
ALIVE_S = (5.0, 8.0) if SOAK else (3.0, 5.0)


def test_worker_kills_neither_freeze_a_paced_domain_nor_push_it_past_its_cap(
        deploy: Callable[..., Deployment], targets: Callable[..., PacedTarget],
        request: pytest.FixtureRequest) -> None:
    d = deploy(pacing=True, domain_delay_s=DELAY_S, domain_max_in_flight=CAP)
    lease_ms = int(d.settings.lease_s * 1000)
    sites = [targets(TASK_S) for _ in range(DOMAINS)]
    jobs = [d.job(url=site.url(f"/paced/{i}"), interval_s=INTERVAL_S)
            for site in sites for i in range(JOBS_PER_DOMAIN)]
    d.store.upsert_many(jobs)
    ids = [job.id for job in jobs]
    beat = d.start_beat()

    rng = random.Random(11)
    for k in range(KILLS):
        worker = d.start_worker(f"w{k}", pool="prefork", concurrency=4)
        wait_ready(d, worker)
        time.sleep(rng.uniform(*ALIVE_S))
        worker.crash()

    end_ms = d.store.now_ms()
    last = d.start_worker("last", pool="prefork", concurrency=4)
    wait_ready(d, last)
    # What the dead workers held comes back one lease after their deaths; then
    # every job runs within its domain's pace (20 jobs x 0.5 s) and interval.
    try:
        wait_all(d, ids, lambda st: (st.last_settled_ms or 0) > end_ms,
                 lease_ms / 1000 + INTERVAL_S + 120,
                 "every job of every domain to run after the crash loop")
    except AssertionError as exc:
        late = {job_id: st for job_id, st in states(d).items()
                if (st.last_settled_ms or 0) <= end_ms}
        domains = {site.host: d.store.domain(site.host) for site in sites}
        raise AssertionError(f"{exc}: {len(late)} jobs late, e.g. {list(late.items())[:4]}; "
                             f"now {d.store.now_ms()}; domains {domains}") from None
    beat.stop()
    d.wait_for(lambda: not any(st.status in ("queued", "running")
                               for st in states(d).values()),
               60, "the last worker to drain what beat published")
    in_flight = {site.host: d.store.domain(site.host).in_flight for site in sites}
    peak = {site.host: max((a.in_flight for a in site.arrivals()), default=0) for site in sites}
    tally = counters(d)
    report(request, "pacing_crash_loop", domains=DOMAINS, jobs=len(ids), kills=KILLS,
           cap=CAP, peak_in_flight=peak, in_flight_at_rest=in_flight,
           arrivals={site.host: len(site.arrivals()) for site in sites},
           orphaned=tally["orphaned"], redelivered=tally["redelivered"],
           deferred=tally["deferred"])

    assert all(n <= CAP for n in peak.values()), peak
    assert max(peak.values()) == CAP, "the cap must be reached to be proven"
    assert in_flight == dict.fromkeys(in_flight, 0), in_flight
    assert tally["orphaned"] + tally["redelivered"] >= 1, "the kills must strand something"
