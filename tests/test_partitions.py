"""A partitioned store (``zsched_partitions``) on one real Redis: every operation
routes each job to its own partition, fleet-wide reads merge all of them, and
beat claims each occurrence once. The same code runs on Redis Cluster in
tests/cluster/."""

from __future__ import annotations

import base64
import json
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery

from celery_zsched.beat.scheduler import ZSchedScheduler
from celery_zsched.beat.visits import Visits
from celery_zsched.core.errors import LayoutMismatch
from celery_zsched.core.job import Job
from celery_zsched.core.results import ClaimBatch
from celery_zsched.store import Store
from celery_zsched.store.keys import Keys, partition_of

P = 4


def _job(job_id: str, **fields: Any) -> Job:
    data: dict[str, Any] = {"id": job_id, "task": "tests.noop", "interval_s": 60, "jitter_s": 0}
    data.update(fields)
    return Job.from_dict(data)


@pytest.fixture
def pstore(make_store: Callable[..., Store]) -> Store:
    return make_store(partitions=P)


def _due_now(store: Store, ids: list[str], at: int | None = None) -> None:
    """Make ``ids`` due at ``at`` (default: now), straight in their partitions' zsets."""
    at = store.now_ms() if at is None else at
    for job_id in ids:
        store.client.zadd(store.part_of(job_id).schedule, {job_id: at}, xx=True)


def test_partition_keys_carry_their_own_hash_tags() -> None:
    base = Keys.for_prefix("{zsched}:")
    assert base.partition(0, 1) is base  # one partition: the pre-partition layout
    assert [k.prefix for k in base.partitions(3)] == ["{zsched:0}:", "{zsched:1}:", "{zsched:2}:"]
    assert Keys.for_prefix("app:{x}:").partition(2, 4).prefix == "app:{x:2}:"
    # The layout record stays on the base prefix whatever the count.
    assert base.layout == "{zsched}:layout"
    # Stable across processes and Python versions: CRC-32, not hash().
    assert partition_of("example", 16) == zlib.crc32(b"example") % 16
    assert [partition_of(f"j{i}", 1) for i in range(5)] == [0] * 5


def test_jobs_spread_over_partitions_and_reads_merge_them(pstore: Store) -> None:
    jobs = [_job(f"j{i:03d}") for i in range(400)]
    report = pstore.upsert_many(jobs, stagger=True)
    assert report.created == 400
    sizes = [pstore.client.hlen(keys.defs) for keys in pstore.parts]
    assert sum(sizes) == 400 and min(sizes) > 60, sizes  # CRC-32 spreads evenly
    for job in jobs[:50]:  # each job is in its own partition and nowhere else
        holders = [k for k in pstore.parts if pstore.client.hexists(k.defs, job.id)]
        assert holders == [pstore.part_of(job.id)]
    # get_many keeps the caller's order across partitions, None for unknown ids.
    ids = ["j010", "nope", "j003", "j399", "j200"]
    infos = pstore.get_many(ids)
    assert [i.job.id if i else None for i in infos] == ["j010", None, "j003", "j399", "j200"]
    assert pstore.stats()["jobs"] == 400 and pstore.stats()["scheduled"] == 400
    assert pstore.stats()["partitions"] == P
    # list_jobs merges the partitions by due time, page by page.
    everything = [i.job.id for i in pstore.list_jobs(0, 400)]
    pages = [i.job.id for off in range(0, 400, 37) for i in pstore.list_jobs(off, 37)]
    assert pages == everything and len(set(everything)) == 400
    dues = [pstore.get(job_id).due_ms for job_id in everything[:40]]
    assert dues == sorted(dues)
    assert pstore.peek_next_due() == min(i.due_ms for i in pstore.list_jobs(0, 400) if i.due_ms)
    assert sorted(j.id for j in pstore.iter_jobs(count=17)) == sorted(j.id for j in jobs)


def test_control_start_settle_and_reap_route_to_the_jobs_partition(pstore: Store) -> None:
    ids = [f"c{i}" for i in range(40)]
    pstore.upsert_many([_job(i) for i in ids], stagger=False)
    assert pstore.pause(*ids[:10]) == 10
    assert {j.id for j in pstore.iter_jobs() if not j.enabled} == set(ids[:10])
    assert pstore.resume(*ids[:10]) == 10
    _due_now(pstore, ids)
    batch = pstore.claim(100)
    assert sorted(c.job.id for c in batch.jobs) == sorted(ids)
    started = [pstore.start(c.job.id, c.occurrence, c.attempt) for c in batch.jobs]
    assert all(s.runs for s in started)
    # A heartbeat from a worker reaches every partition; unknown triples come back.
    gone = pstore.heartbeat([(c.job.id, c.occurrence, c.attempt) for c in batch.jobs[:5]]
                            + [("c0", 1, 99)], worker="w1", queues=["celery"])
    assert gone == ["c0"]
    assert all(pstore.client.zscore(k.workers, "w1") is not None for k in pstore.parts)
    for claimed in batch.jobs[:20]:
        res = pstore.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "complete")
        assert res.applied, (claimed.job.id, res)
    assert pstore.stats()["running"] == 20
    # Expire the 20 remaining execution leases in every partition: one reap finds them all.
    for keys in pstore.parts:
        for job_id, _ in pstore.client.zrange(keys.leases, 0, -1, withscores=True):
            pstore.client.zadd(keys.leases, {job_id: 1})
    reaped = pstore.reap(1000)
    assert reaped.redelivered == 20 and len(set(reaped.ids)) == 20
    assert pstore.delete(*ids) == 40
    assert pstore.stats()["jobs"] == 0


def test_dead_letters_and_events_merge_newest_first(pstore: Store) -> None:
    ids = [f"d{i}" for i in range(12)]
    pstore.upsert_many([_job(i) for i in ids], stagger=False)
    _due_now(pstore, ids)
    batch = pstore.claim(100)
    since = pstore.now_ms()
    for claimed in sorted(batch.jobs, key=lambda c: c.job.id):
        pstore.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "complete")
        # Entry ids order events within one stream; across partitions only the
        # millisecond does, so settle one per millisecond.
        time.sleep(0.003)
    events = pstore.recent_events(since, 5)
    assert len(events) == 5
    assert [e["id"] for e in events] == ["d9", "d8", "d7", "d6", "d5"]
    for n, job_id in enumerate(ids[:6]):  # dead-letter six, oldest first
        pstore.client.zadd(pstore.part_of(job_id).dead, {job_id: 1000 + n})
    assert pstore.dead_ids(3) == ["d5", "d4", "d3"]
    assert pstore.stats()["dead"] == 6


def test_claims_race_across_partitions_and_take_each_job_once(
        make_store: Callable[..., Store], make_settings: Any) -> None:
    # One queue, nothing started: its bound is the total cap, so all 3,000 are claimed.
    store = make_store(partitions=P, queue_max_queued=10_000)
    ids = [f"r{i:04d}" for i in range(3000)]
    store.upsert_many([_job(i) for i in ids], stagger=False)
    _due_now(store, ids)
    # Four claimers, each with its own client, as four beats would be.
    claimers = [Store(redis.Redis.from_url(store.settings.redis_url, decode_responses=True),
                      store.settings) for _ in range(4)]
    got: list[str] = []
    lock = threading.Lock()

    def drain(claimer: Store) -> None:
        visits = Visits(claimer.partitions)
        while True:
            plan = visits.plan(claimer.now_ms(), 100)
            batches = claimer.claim_parts(plan)
            visits.record(plan, batches)
            jobs = [c.job.id for b in batches.values() for c in b.jobs]
            with lock:
                got.extend(jobs)
            if not jobs:
                return

    threads = [threading.Thread(target=drain, args=(c,)) for c in claimers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    counts = Counter(got)
    assert len(counts) == 3000 and max(counts.values()) == 1


def test_visits_share_the_batch_between_partitions_with_due_work() -> None:
    visits = Visits(4)
    first = visits.plan(1000, 100)
    assert sorted(first) == [0, 1, 2, 3] and sum(first.values()) == 100  # nothing known yet

    def batch(next_due: int | None, claimed: int, room: int = 50) -> ClaimBatch:
        return ClaimBatch(1000, next_due, None, [object()] * claimed, room)  # type: ignore[list-item]

    visits.record(first, {0: batch(900, first[0]), 1: batch(5000, 0), 2: batch(None, 0),
                          3: batch(800, 3)})
    assert visits.any_full  # partition 0 gave all it was asked for
    plan = visits.plan(1000, 100)
    # 0 (full) and 3 (still due) share the batch; 1 and 2 are asked for one job each.
    assert plan[1] == plan[2] == 1 and plan[0] + plan[3] == 100
    visits.record(plan, {0: batch(5000, 3), 1: batch(5000, 0), 2: batch(None, 0),
                         3: batch(6000, 0, room=0)})
    assert not visits.any_full and not visits.held
    assert visits.next_wake_ms() == 5000
    visits.record(plan, {3: batch(900, 0, room=0)})
    assert visits.held  # due work held back by the bound in partition 3


def test_a_mismatched_partition_count_is_refused(make_store: Callable[..., Store]) -> None:
    four = make_store(partitions=P)
    four.upsert(_job("m1"))  # a fresh store records its count on first use
    assert four.client.get(four.base.layout) == str(P)
    one = Store(four.client, four.settings.__class__(
        **{**four.settings.__dict__, "partitions": 1}))
    with pytest.raises(LayoutMismatch, match="has 4 partitions but zsched_partitions is 1"):
        one.get("m1")
    # A one-partition store with jobs and no record is not taken over by P=4.
    legacy = make_store()
    legacy.upsert(_job("old"))
    upgraded = Store(legacy.client, legacy.settings.__class__(
        **{**legacy.settings.__dict__, "partitions": P}))
    with pytest.raises(LayoutMismatch, match="has 1 partitions"):
        upgraded.stats()


def test_beat_on_a_partitioned_store_publishes_each_due_job_once(
        make_store: Callable[..., Store], redis_url: str, rclient: redis.Redis) -> None:
    # One queue, no worker: its bound is the total cap (640), so all 500 go out.
    store = make_store(partitions=P, batch_size=64, queue_max_queued=640)
    ids = [f"b{i:03d}" for i in range(500)]
    store.upsert_many([_job(i) for i in ids], stagger=False)
    _due_now(store, ids)
    app = Celery("partition-beat", set_as_current=False)
    app.conf.update(broker_url=redis_url, beat_schedule={},
                    zsched_redis_url=store.settings.redis_url,
                    zsched_key_prefix=store.settings.key_prefix, zsched_partitions=P,
                    zsched_batch_size=64, zsched_queue_max_queued=640,
                    task_default_queue="partq")
    scheduler = ZSchedScheduler(app=app)
    waits: list[float] = []
    try:
        while len(waits) < 40 and (not waits or waits[-1] == 0.0):
            waits.append(scheduler.tick())
    finally:
        scheduler.close()
    # Full batches: no sleep while more is due (a tick claims on while its batches come
    # back full, and returns 0 if its time ran out first), then a sleep.
    assert waits[-1] > 0 and set(waits[:-1]) <= {0.0}
    messages = [json.loads(raw) for raw in rclient.lrange("partq", 0, -1)]
    task_ids = [m["headers"]["id"] for m in messages]
    assert len(task_ids) == 500 and len(set(task_ids)) == 500
    assert {m["headers"]["task"] for m in messages} == {"tests.noop"}
    assert all(json.loads(base64.b64decode(m["body"]))[0] == [] for m in messages)
    assert store.stats()["queued"] == 500


def test_beat_sleeps_until_the_earliest_due_job_of_any_partition(
        make_store: Callable[..., Store], redis_url: str) -> None:
    store = make_store(partitions=P)
    ids = [f"w{i}" for i in range(40)]
    store.upsert_many([_job(i) for i in ids], stagger=False)
    now = store.now_ms()
    for n, job_id in enumerate(ids):  # all far away but one, in whichever partition
        store.client.zadd(store.part_of(job_id).schedule, {job_id: now + 60_000 + n}, xx=True)
    soonest = ids[17]
    store.client.zadd(store.part_of(soonest).schedule, {soonest: now + 400}, xx=True)
    app = Celery("partition-sleep", set_as_current=False)
    app.conf.update(broker_url=redis_url, zsched_redis_url=store.settings.redis_url,
                    zsched_key_prefix=store.settings.key_prefix, zsched_partitions=P)
    scheduler = ZSchedScheduler(app=app)
    try:
        wait = scheduler.tick()
        # At most the soonest job's 400 ms, not the 1 s cap nor a minute; how much
        # less depends on how long this host took to get here (not asserted).
        assert 0.0 <= wait <= 0.4
        time.sleep(wait + 0.05)
        assert scheduler.tick() == 1.0  # the soonest was claimed; the rest are a minute out
        assert store.get(soonest).status == "queued"
    finally:
        scheduler.close()


def test_beat_on_an_unreachable_cluster_backs_off_instead_of_crashing(
        caplog: pytest.LogCaptureFixture) -> None:
    from tests.helpers import free_port

    app = Celery("cluster-down", set_as_current=False)
    app.conf.update(broker_url="memory://", zsched_redis_url=f"redis://127.0.0.1:{free_port()}/0",
                    zsched_redis_cluster=True, zsched_partitions=P)
    scheduler = ZSchedScheduler(app=app)
    try:
        with caplog.at_level("WARNING", logger="celery_zsched"):
            waits = [scheduler.tick(), scheduler.tick()]
    finally:
        scheduler.close()
    assert waits == [1.0, 2.0]  # 0.5 s doubling: it waits and tries again
    assert "Redis unreachable" in caplog.text

