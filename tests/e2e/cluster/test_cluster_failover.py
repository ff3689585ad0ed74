"""A master of the cluster is SIGKILLed under load: its replica takes over, nothing is lost.

Replication is asynchronous, so the promoted replica may miss the last writes
its master acknowledged: a settle, say, after which the occurrence looks
running again and is redelivered with the same task id when its short lease
ends. Such duplicates are allowed and counted. A lost occurrence, a job that
never fires again, is not.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from celery_zsched.store.keys import partition_of
from e2e.cluster.conftest import CLUSTER_PARTITIONS
from e2e.conftest import Deployment, TargetServer, log_events
from tests.cluster import LocalCluster

pytestmark = pytest.mark.slow

JOBS = 24
INTERVAL_S = 2


def test_beat_and_worker_ride_out_a_master_failover_and_lose_no_occurrence(
        own_cluster: LocalCluster, cluster_deploy: Callable[..., Deployment],
        target: TargetServer) -> None:
    # Short lease and delivery deadline: whatever the failover catches in flight
    # (or the promoted replica never heard was settled) comes back within seconds.
    d = cluster_deploy(on=own_cluster, lease_s=2, delivery_timeout_s=4)
    jobs = [d.job(url=target.url(f"/ok/fo/{i}"), interval_s=INTERVAL_S) for i in range(JOBS)]
    d.store.upsert_many(jobs)
    worker = d.start_worker("worker", pool="prefork", concurrency=2)
    d.wait_for(lambda: " ready." in worker.text(), 30, "the worker to be ready")
    beat = d.start_beat()

    def hits_after(t: float) -> Counter[str]:
        return Counter(h.path.rsplit("/", 1)[1] for h in target.hits_under("/ok/fo/")
                       if h.at > t)
    d.wait_for(lambda: len(hits_after(0)) == JOBS and min(hits_after(0).values()) >= 2, 30,
               "every job to fire twice")

    # The victim: the master with the most partitions, but not the node the
    # processes were given as their URL (it stays their way in).
    entry = urlsplit(d.settings.redis_url).port
    owners = Counter(own_cluster.master_of_key(keys.defs) for keys in d.store.parts)
    victim = max((m for m in owners if m != entry), key=lambda m: owners[m])
    on_victim = [j for j in jobs
                 if own_cluster.master_of_key(d.store.parts[
                     partition_of(j.id, CLUSTER_PARTITIONS)].defs) == victim]
    killed_at = time.monotonic()
    own_cluster.node(victim).kill()
    promoted = own_cluster.wait_promoted(victim, 30)
    promoted_at = time.monotonic()

    # Every job fires again, twice, after the promotion: none is lost.
    deadline = promoted_at + 45
    while time.monotonic() < deadline:
        d.check_alive()
        after = hits_after(promoted_at)
        if len(after) == JOBS and min(after.values()) >= 2:
            break
        time.sleep(0.2)
    after = hits_after(promoted_at)
    lost = [str(i) for i in range(JOBS) if after[str(i)] == 0]
    first_after: dict[str, float] = {}
    for h in target.hits_under("/ok/fo/"):
        if h.at > promoted_at:
            first_after.setdefault(h.path, h.at)
    resumed_s = max(first_after.values(), default=promoted_at) - promoted_at
    task_ids = Counter(h.task_id for h in target.hits_under("/ok/fo/"))
    duplicates = sum(n - 1 for n in task_ids.values())
    reaped = log_events(beat.text(), "reaped")
    print(f"\nfailover: killed master {victim} ({owners[victim]} of {CLUSTER_PARTITIONS} "
          f"partitions, {len(on_victim)} of {JOBS} jobs); replica {promoted} promoted after "
          f"{promoted_at - killed_at:.1f} s; every job fired again within {resumed_s:.1f} s of "
          f"the promotion; runs {sum(task_ids.values())}, duplicate publishes (same task id) "
          f"{duplicates}, lost occurrences {len(lost)}; reaps "
          f"{[(r['redelivered'], r['lost']) for r in reaped]}")
    assert lost == [], f"jobs that never fired again after the failover: {lost}"
    assert min(after.values()) >= 2
    d.check_alive()
    assert beat.alive() and worker.alive()
    assert "unavailable" in beat.text(), "beat never noticed the failover"
