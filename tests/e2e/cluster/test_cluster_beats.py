"""Real beat and worker processes on a Redis Cluster: exactly-once claims, crash redelivery."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable

import pytest

from celery_zsched.store import task_id_for
from celery_zsched.store.keys import partition_of
from e2e.cluster.conftest import CLUSTER_PARTITIONS
from e2e.conftest import Deployment, TargetServer, log_events
from e2e.test_two_beats import broker_messages, promoted
from tests.cluster import LocalCluster

pytestmark = pytest.mark.slow

JOBS = 2000


def test_two_beats_on_a_cluster_publish_each_of_2000_due_occurrences_exactly_once(
        cluster: LocalCluster, cluster_deploy: Callable[..., Deployment]) -> None:
    # No worker runs, so the backpressure bound must admit the whole storm. Each
    # partition's bound is its share of max_queued (ceil(max_queued / P)) while
    # the jobs do not split evenly: leave room. One queue: its bound is the whole cap.
    d = cluster_deploy(batch_size=50, max_queued=2 * JOBS, queue_max_queued=2 * JOBS)
    beats = [d.start_beat("beat1"), d.start_beat("beat2")]
    d.wait_for(lambda: all("static_synced" in b.text() for b in beats), 30,
               "both beats to start ticking")
    due_s = (d.store.now_ms() + 2000) / 1000
    jobs = [d.job(url=f"http://127.0.0.1:9/storm/{i}", interval_s=3600, start_at=due_s)
            for i in range(JOBS)]
    assert d.store.upsert_many(jobs, stagger=False).created == JOBS
    # The storm is spread over every partition, and the partitions over all masters.
    parts = Counter(partition_of(j.id, CLUSTER_PARTITIONS) for j in jobs)
    assert len(parts) == CLUSTER_PARTITIONS
    assert {cluster.master_of_key(k.defs) for k in d.store.parts} == set(cluster.masters())

    d.wait_for(lambda: sum(promoted(b.text()) for b in beats) >= JOBS, 60,
               f"the beats to publish {JOBS} jobs")
    stats = d.store.stats()
    assert (stats["scheduled"], stats["in_flight"], stats["total_promoted"]) == (0, JOBS, JOBS)

    messages = broker_messages(d)
    task_ids = Counter(m["headers"]["id"] for m in messages)
    duplicates = sum(n - 1 for n in task_ids.values())
    missing = {j.id for j in jobs} - {m["headers"]["zsched_job_id"] for m in messages}
    print(f"\ntwo beats on the cluster: {len(messages)} messages, "
          f"{duplicates} duplicates, {len(missing)} missing")
    assert (len(messages), duplicates, missing) == (JOBS, 0, set())
    for m in messages:
        h = m["headers"]
        assert h["id"] == task_id_for(h["zsched_job_id"], h["zsched_occurrence"],
                                      h["zsched_attempt"])
    per_beat = [promoted(b.text()) for b in beats]
    assert sum(per_beat) == JOBS and min(per_beat) > 0, per_beat


def test_a_prefork_worker_sigkilled_mid_task_on_a_cluster_is_redelivered_with_the_same_task_id(
        cluster_deploy: Callable[..., Deployment], target: TargetServer) -> None:
    d = cluster_deploy(lease_s=3)
    path = "/slow/cluster-kill"
    # /slow sleeps 30 s on the first request of a task id only: the redelivery is fast.
    job = d.job(url=target.url(path + "?s=30"), interval_s=3600)
    d.store.upsert(job)
    part = partition_of(job.id, CLUSTER_PARTITIONS)
    beat = d.start_beat()
    first_worker = d.start_worker("worker1", pool="prefork", concurrency=1)

    first = d.wait_for(lambda: target.hits(path), 30, "the first delivery to reach /slow")[0]
    running = d.info(job.id)
    assert running.status == "running", running.state
    occurrence, attempt = running.state.occurrence, running.state.attempt
    assert first.task_id == task_id_for(job.id, occurrence, attempt)
    first_worker.crash()

    d.start_worker("worker2", pool="prefork", concurrency=1)
    d.wait_for(lambda: len(target.hits(path)) >= 2, 30, "the redelivery to reach /slow")
    info = d.wait_info(job.id, lambda i: i.status not in ("queued", "running"), 15,
                       "the redelivered occurrence to settle")

    second = target.hits(path)[1]
    assert (second.task_id, second.worker) == (first.task_id, "worker2")
    assert info.status == "scheduled", info.state
    assert info.state.runs == 1 and info.state.last_outcome == "complete", info.state
    settles = d.store.events(part=part)
    assert len(settles) == 1, settles
    fields = settles[0][1]
    assert (fields["occ"], fields["attempt"], fields["status"]) == (
        str(occurrence), str(attempt), "complete")
    assert json.loads(fields["data"])["task_id"] == first.task_id
    reaped = log_events(beat.text(), "reaped")
    assert [(r["redelivered"], r["ids"]) for r in reaped] == [(1, [job.id])], reaped
    assert len(target.hits(path)) == 2
