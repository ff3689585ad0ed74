"""Pacing on a Cluster while a master is SIGKILLed under load (real beat, prefork worker).

Six targets, each on a loopback address of its own (a domain of its own), four
jobs each, pacing on with the default delay and cap. The master that holds the
most partitions is killed; its replica takes over. Measured at the targets:
every job fires again after the promotion (nothing lost), no task id reaches a
target twice (no duplicate publish), and no target sees two requests closer
than its delay (less the start-to-socket path, see tests/e2e/test_pacing.py).
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from e2e.cluster.conftest import CLUSTER_PARTITIONS
from e2e.conftest import Deployment
from e2e.targets import PacedTarget
from e2e.test_pacing import START_TO_SOCKET_S
from tests.cluster import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

DOMAINS, PER_DOMAIN = 6, 4


def test_a_master_failover_with_pacing_loses_nothing_doubles_nothing_and_keeps_every_delay(
        own_cluster: LocalCluster, cluster_deploy: Callable[..., Deployment],
        targets: Callable[..., PacedTarget]) -> None:
    # Short lease and delivery deadline (as test_cluster_failover): what the failover
    # catches in flight comes back within seconds. The pacing settings are the defaults.
    d = cluster_deploy(on=own_cluster, lease_s=2, delivery_timeout_s=4, pacing=True)
    sites = [targets(0.0) for _ in range(DOMAINS)]
    jobs = [d.job(url=site.url(f"/p/{i}"), interval_s=2, jitter_s=0)
            for site in sites for i in range(PER_DOMAIN)]
    d.store.upsert_many(jobs)
    worker = d.start_worker("worker", pool="prefork", concurrency=4)
    d.wait_for(lambda: " ready." in worker.text(), 30, "the worker to be ready")
    beat = d.start_beat()

    def fired_after(t: float) -> set[str]:
        """Jobs settled after ``t`` (Redis' clock, this machine's)."""
        return {info.job.id for info in d.store.get_many([j.id for j in jobs])
                if info and (info.state.last_settled_ms or 0) / 1000 > t}
    d.wait_for(lambda: len(fired_after(0)) == len(jobs), 60, "every job to fire once")

    entry = urlsplit(d.settings.redis_url).port
    homes = Counter(own_cluster.master_of_key(d.store.part_of(j.id).defs) for j in jobs)
    victim = max((m for m in homes if m != entry), key=lambda m: homes[m])
    killed_at = time.time()
    own_cluster.node(victim).kill()
    own_cluster.wait_promoted(victim, 30)
    promoted_at = time.time()
    d.wait_for(lambda: len(fired_after(promoted_at)) == len(jobs), 90,
               "every job to fire again after the promotion")
    d.check_alive()
    ended_at = time.time()

    task_ids = Counter(a.task_id for site in sites for a in site.arrivals())
    duplicates = sum(n - 1 for n in task_ids.values())
    delay = d.store.settings.domain_delay_s
    gaps = {site.host: [b.at - a.at for a, b in itertools.pairwise(site.arrivals())]
            for site in sites}
    closest = min(g for site_gaps in gaps.values() for g in site_gaps)
    violations = sum(g < delay - START_TO_SOCKET_S for site_gaps in gaps.values()
                     for g in site_gaps)
    started: dict[str, int] = {}
    for part in range(d.store.partitions):
        for _id, fields in d.store.events(count=100_000, part=part):
            data = json.loads(fields["data"])
            if data.get("task_id") and data.get("started_ms"):
                started[str(data["task_id"])] = int(data["started_ms"])
    start_gaps = [b - a for site in sites for a, b in itertools.pairwise(sorted(
        started[x.task_id] for x in site.arrivals() if x.task_id in started))]
    early = [g for g in start_gaps if g < delay * 1000]
    breaches = [(site.host, round(a.at - killed_at, 3), round(b.at - killed_at, 3),
                 started.get(a.task_id), started.get(b.task_id))
                for site in sites for a, b in itertools.pairwise(site.arrivals())
                if b.at - a.at < delay - START_TO_SOCKET_S]
    print(f"\nbreaches at the targets (host, arrivals after the kill, starts): {breaches}")
    print(f"\nstart gaps (Redis' clock, {len(start_gaps)}): smallest {min(start_gaps)} ms, "
          f"closer than the delay {early}")
    print(f"\nfailover with pacing: killed master {victim} ({homes[victim]} of {len(jobs)} jobs, "
          f"P={CLUSTER_PARTITIONS}) at {killed_at:.0f}; runs {sum(task_ids.values())} over "
          f"{ended_at - killed_at:.1f} s; duplicate task ids at the targets {duplicates}; "
          f"closest gap at one target {closest:.3f} s (delay {delay} s); violations "
          f"{violations}; lost 0 (every job fired again after the promotion)")
    assert sum(task_ids.values()) >= 2 * len(jobs)
    assert duplicates == 0
    assert early == []
    assert violations == 0
    assert beat.alive() and worker.alive()
