"""The partitioned store on a real Redis Cluster: every operation, and the spread over masters."""

from __future__ import annotations

import dataclasses
import io
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from celery_zsched.core.job import Job
from celery_zsched.core.rows import write_rows
from celery_zsched.store import Store
from celery_zsched.store.keys import Keys, partition_of
from celery_zsched.store.repartition import repartition
from e2e.cluster.conftest import CLUSTER_PARTITIONS
from tests.cluster import LocalCluster
from tests.test_repartition import records


def jobs(count: int, **fields: object) -> list[Job]:
    """``count`` URL jobs (distinct ids, so they spread over every partition)."""
    return [Job.from_dict({"url": f"http://127.0.0.1:1/c/{i}", "interval_s": 3600, **fields})
            for i in range(count)]


def test_the_default_prefix_spreads_its_partitions_over_all_three_masters(
        cluster: LocalCluster) -> None:
    parts = Keys().partitions(CLUSTER_PARTITIONS)
    owners = Counter(cluster.master_of_key(keys.defs) for keys in parts)
    assert sorted(owners) == cluster.masters(), owners
    # Every key of a partition is in one slot; no two partitions share one.
    slots = [{key_slot(k.encode()) for k in keys.all()} for keys in parts]
    assert all(len(s) == 1 for s in slots) and len({s.pop() for s in slots}) == len(parts)


def test_store_operations_work_across_partitions_on_three_masters(
        cluster: LocalCluster, cluster_store: Callable[..., Store]) -> None:
    store = cluster_store(lease_s=0.5, max_deliveries=1)
    batch = jobs(300)
    report = store.upsert_many(batch, stagger=False)
    assert (report.created, report.updated) == (300, 0)
    assert store.upsert_many(batch).updated == 300  # idempotent

    # The jobs really sit on the masters that serve their partitions, and on all three.
    per_master: Counter[int] = Counter()
    for index, keys in enumerate(store.parts):
        with cluster.node(cluster.master_of_key(keys.defs)).admin() as node:
            held = node.hlen(keys.defs)
        assert held == sum(1 for j in batch if partition_of(j.id, store.partitions) == index)
        per_master[cluster.master_of_key(keys.defs)] += held
    assert sorted(per_master) == cluster.masters() and sum(per_master.values()) == 300
    assert min(per_master.values()) > 0, per_master

    ids = [j.id for j in batch]
    infos = store.get_many([*ids, "nope"])
    assert [i.job.id for i in infos[:-1] if i] == ids and infos[-1] is None
    assert all(i and i.status == "scheduled" for i in infos[:-1])
    page = store.list_jobs(0, 50)
    dues = [p.due_ms or 0 for p in page]
    assert len(page) == 50 and dues == sorted(dues) and all(dues)
    stats = store.stats()
    assert (stats["jobs"], stats["scheduled"], stats["due_now"], stats["partitions"]) == (
        300, 300, 300, CLUSTER_PARTITIONS)
    assert {j.id for j in store.iter_jobs()} == set(ids)
    exported = io.StringIO()
    assert write_rows(store.iter_jobs(), exported, "json") == 300
    assert store.peek_next_due() is not None

    # Claim everything (one pipeline over every partition); each job exactly once.
    claimed = store.claim(1000).jobs
    assert sorted(c.job.id for c in claimed) == sorted(ids)
    assert store.claim(1000).jobs == []
    assert store.stats()["in_flight"] == 300

    # Start all; settle most, let two leases run out.
    for c in claimed:
        assert store.start(c.job.id, c.occurrence, c.attempt).status == "ok"
    crashed = {c.job.id for c in claimed[:2]}
    for c in claimed[2:]:
        result = store.settle(c.job.id, c.occurrence, c.attempt, "complete")
        assert result.applied and result.status == "scheduled", result
        # A duplicate settle is a no-op.
        assert not store.settle(c.job.id, c.occurrence, c.attempt, "complete").applied
    events = store.recent_events(0, 1000)
    assert len(events) == 298 and {e["id"] for e in events} == set(ids) - crashed
    # Workers are alive in every partition, so the crashed executions' partitions reap them.
    store.heartbeat([], worker="w1", queues=["celery"])
    time.sleep(0.7)
    reaped = store.reap()
    assert (reaped.dead, set(reaped.ids)) == (2, crashed), reaped
    assert set(store.dead_ids(10)) == crashed
    assert store.stats()["dead"] == 2

    # Pause, resume, delete: routed to each job's partition.
    some = ids[2:40]
    assert store.pause(*some) == len(some)
    assert store.stats()["paused"] == len(some)
    assert all(i and i.paused and not i.job.enabled for i in store.get_many(some))
    assert store.resume(*some) == len(some)
    assert store.stats()["paused"] == 0
    assert store.delete(*some) == len(some)
    assert store.get_many(some) == [None] * len(some)
    final = store.stats()
    assert (final["jobs"], final["total_complete"], final["dead"]) == (300 - len(some), 298, 2)


def test_repartition_on_the_cluster_moves_jobs_between_masters_and_loses_nothing(
        cluster_store: Callable[..., Store]) -> None:
    store = cluster_store()
    store.upsert_many(jobs(400), stagger=True)
    store.pause(*[j.id for j in jobs(30)])
    before = records(store)
    report = repartition(store.client, store.settings, 5, chunk=64)
    assert report.moved + report.kept == 400 and report.moved > 0
    moved = Store(store.client, dataclasses.replace(store.settings, partitions=5))
    assert records(moved) == before
    assert moved.stats()["jobs"] == 400 and moved.stats()["paused"] == 30
    back = repartition(store.client, store.settings, store.partitions)
    assert back.target == store.partitions
    assert records(Store(store.client, store.settings)) == before


def _calls(cluster: LocalCluster, command: str) -> int:
    """Calls of ``command`` (as INFO commandstats names it) over every live node."""
    total = 0
    for node in cluster.live():
        with node.admin() as admin:
            stats = admin.info("commandstats")
        total += int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
    return total


@pytest.mark.parametrize("pacing", [False, True], ids=["by-id", "paced-by-domain"])
def test_an_idle_claim_over_every_partition_is_one_round_trip_per_master(
        cluster: LocalCluster, cluster_store: Callable[..., Store],
        monkeypatch: pytest.MonkeyPatch, pacing: bool) -> None:
    store = cluster_store(pacing=pacing)
    if pacing:  # jobs over many domains, so over every partition
        store.upsert_many([Job.from_dict({"url": f"http://d{i}.example/", "interval_s": 3600})
                           for i in range(50)], stagger=True)
        placed = store.locate([j.id for j in store.iter_jobs()])
        assert len(set(placed.values())) > len(cluster.masters())
    else:
        store.upsert_many(jobs(50), stagger=True)
    plan = dict.fromkeys(range(store.partitions), 1)
    store.claim_parts(plan)  # warm: connections open, scripts loaded
    sent: list[int] = []
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        sent.append(1)
        original(self, command, check_health)

    getkeys, evalsha = _calls(cluster, "command|getkeys"), _calls(cluster, "evalsha")
    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    batches = store.claim_parts(plan)
    monkeypatch.undo()
    assert len(batches) == store.partitions
    # One write per master, nothing asked of the cluster first (no COMMAND GETKEYS).
    assert len(sent) == len(cluster.masters())
    assert _calls(cluster, "command|getkeys") == getkeys
    assert _calls(cluster, "evalsha") - evalsha == store.partitions
