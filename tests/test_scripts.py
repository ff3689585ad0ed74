"""Each Lua script, proven directly against the throwaway Redis.

Scripts are driven through :class:`Store` and, where the wire format matters,
called with raw KEYS/ARGV. Key names always come from ``store.keys``.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from importlib import resources
from typing import Any

import pytest
import redis

from celery_zsched.config import Settings
from celery_zsched.errors import JobNotFound
from celery_zsched.job import Job
from celery_zsched.store import Claimed, Store, task_id_for
from tests.helpers import store_snapshot


def _job(job_id: str = "j1", **fields: Any) -> Job:
    data: dict[str, Any] = {"id": job_id, "task": "tests.noop", "interval_s": 60, "jitter_s": 0}
    data.update(fields)
    return Job.from_dict(data)


def _claim_one(store: Store, job: Job | None = None, lease_s: float | None = None) -> Claimed:
    job = job or _job()
    store.upsert(job)
    batch = store.claim(lease_s=lease_s)
    assert [c.job.id for c in batch.jobs] == [job.id]
    return batch.jobs[0]


def _state(store: Store, job_id: str) -> dict[str, Any]:
    raw = store.client.hget(store.keys.state, job_id)
    assert raw is not None, f"no state for {job_id}"
    loaded: dict[str, Any] = json.loads(raw)
    return loaded


def _make_due(store: Store, job_id: str) -> None:
    """Pretend the clock reached the job's due time (the score is moved, not the state)."""
    store.client.zadd(store.keys.schedule, {job_id: store.now_ms() - 1}, xx=True)
    assert store.client.zscore(store.keys.schedule, job_id) is not None


def _lua(name: str) -> str:
    return resources.files("celery_zsched").joinpath(f"lua/{name}.lua").read_text("utf-8")


# --------------------------------------------------------------------- claim
def _claim_until_empty(url: str, prefix: str, ready: Any, out: Any) -> None:
    """Child process: own connection, claim batches of 500 until nothing is due."""
    client = redis.Redis.from_url(url, decode_responses=True)
    store = Store(client, Settings(redis_url=url, key_prefix=prefix))
    client.ping()
    ready.wait(timeout=60)
    ids: list[str] = []
    while True:
        batch = store.claim(limit=500)
        if not batch.jobs:
            break
        ids.extend(c.job.id for c in batch.jobs)
    client.close()
    out.put(ids)


def test_two_processes_claim_each_of_10000_due_jobs_exactly_once(
    make_store: Callable[..., Store], redis_url: str
) -> None:
    """Two beat processes racing on 10,000 due jobs claim each exactly once (invariant 1)."""
    store = make_store()
    jobs = [_job(f"job-{i:05d}") for i in range(10_000)]
    report = store.upsert_many(jobs, stagger=False)
    assert report.created == 10_000
    assert store.client.zcount(store.keys.schedule, "-inf", store.now_ms()) == 10_000

    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Barrier(2)
    out = ctx.Queue()
    procs = [ctx.Process(target=_claim_until_empty,
                         args=(redis_url, store.settings.key_prefix, ready, out))
             for _ in range(2)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0, 0]

    first, second = results
    assert len(first) == len(set(first)) and len(second) == len(set(second))
    assert first and second, "both processes must have claimed (they raced)"
    assert set(first) & set(second) == set()
    assert set(first) | set(second) == {j.id for j in jobs}
    assert store.client.zcard(store.keys.schedule) == 0
    assert store.client.zcard(store.keys.leases) == 10_000
    assert store.client.hget(store.keys.counters, "promoted") == "10000"


def test_claim_script_with_raw_keys_returns_documented_layout(store: Store) -> None:
    """claim.lua returns {now, next_due, next_lease, then per job id, def, occ, attempt, d, due}."""
    job = _job("raw-claim")
    later = _job("later")
    store.upsert(job)
    store.upsert(later)
    later_due = store.now_ms() + 3_600_000
    store.client.zadd(store.keys.schedule, {later.id: later_due})
    due = int(store.client.zscore(store.keys.schedule, job.id) or 0)
    k = store.keys
    res = store.client.eval(_lua("claim"), 5, k.schedule, k.leases, k.state, k.defs, k.counters,
                            10, 20_000)
    sec, usec = store.client.time()
    redis_now = sec * 1000 + usec // 1000
    now, next_due, next_lease = res[0], res[1], res[2]
    assert 0 <= redis_now - now < 1000
    assert next_due == later_due
    assert next_lease == now + 20_000
    assert res[3:] == [job.id, job.to_json(), due, 1, 1, due]
    assert store.client.zscore(k.leases, job.id) == now + 20_000
    assert _state(store, job.id)["s"] == "leased"
    # Nothing due: the lists are empty and next_due/next_lease still reported.
    again = store.client.eval(_lua("claim"), 5, k.schedule, k.leases, k.state, k.defs,
                              k.counters, 10, 20_000)
    assert again[1:] == [later_due, now + 20_000]


def test_claim_takes_only_due_jobs_and_at_most_limit(store: Store) -> None:
    """A claim leases at most ``limit`` due jobs, earliest first, and never a future one."""
    now = store.now_ms()
    store.upsert_many([_job(f"d{i}") for i in range(5)], stagger=False)
    store.upsert(_job("future", start_at=(now + 3_600_000) / 1000))
    for i in range(5):
        store.client.zadd(store.keys.schedule, {f"d{i}": now - 10_000 + i}, xx=True)
    first = store.claim(limit=3)
    assert [c.job.id for c in first.jobs] == ["d0", "d1", "d2"]
    assert [c.due_ms for c in first.jobs] == [now - 10_000, now - 9_999, now - 9_998]
    rest = store.claim(limit=3)
    assert [c.job.id for c in rest.jobs] == ["d3", "d4"]
    assert store.claim(limit=3).jobs == []
    assert store.client.zrange(store.keys.schedule, 0, -1) == ["future"]
    future_due = store.client.zscore(store.keys.schedule, "future")
    assert future_due is not None and future_due - now >= 3_599_000
    assert rest.next_due_ms == future_due


def test_claim_drops_schedule_entries_whose_definition_is_gone(store: Store) -> None:
    """A schedule entry with no definition is removed by claim, never published."""
    store.client.zadd(store.keys.schedule, {"orphan": 1})
    store.client.hset(store.keys.state, "orphan", json.dumps({"o": 1, "a": 1}))
    assert store.claim().jobs == []
    assert store.client.zscore(store.keys.schedule, "orphan") is None
    assert store.client.hget(store.keys.state, "orphan") is None
    assert store.client.zcard(store.keys.leases) == 0


# -------------------------------------------------------------------- settle
def test_duplicate_settle_of_same_occurrence_and_attempt_changes_nothing(store: Store) -> None:
    """A second settle of one occurrence/attempt is a no-op (invariant 3)."""
    claimed = _claim_one(store)
    first = store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "complete")
    assert first.applied and first.status == "scheduled"
    before = store_snapshot(store)
    for outcome in ("complete", "error", "skip"):
        dup = store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, outcome)
        assert not dup.applied and dup.status == "stale"
    assert store_snapshot(store) == before


def test_settle_with_an_old_occurrence_changes_nothing(store: Store) -> None:
    """A late settle of a previous occurrence cannot touch the current one in flight."""
    old = _claim_one(store)
    assert store.settle(old.job.id, old.occurrence, old.attempt, "complete").applied
    _make_due(store, old.job.id)
    current = store.claim().jobs[0]
    assert current.occurrence != old.occurrence
    before = store_snapshot(store)
    late = store.settle(old.job.id, old.occurrence, old.attempt, "complete")
    assert (late.applied, late.status) == (False, "stale")
    assert store_snapshot(store) == before
    assert _state(store, old.job.id)["s"] == "leased"


def test_settle_with_wrong_attempt_changes_nothing(store: Store) -> None:
    """A settle naming another attempt of the current occurrence is a no-op."""
    claimed = _claim_one(store)
    before = store_snapshot(store)
    for attempt in (claimed.attempt + 1, claimed.attempt - 1):
        res = store.settle(claimed.job.id, claimed.occurrence, attempt, "complete")
        assert (res.applied, res.status) == (False, "stale")
    res = store.settle(claimed.job.id, claimed.occurrence + 1, claimed.attempt, "error")
    assert not res.applied
    assert store_snapshot(store) == before


def test_settle_for_a_deleted_job_does_not_bring_it_back(store: Store) -> None:
    """Deleting an in-flight job keeps it deleted after its settle (invariant 6)."""
    claimed = _claim_one(store)
    assert store.delete(claimed.job.id) == 1
    res = store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "complete")
    assert (res.applied, res.status) == (False, "deleted")
    k = store.keys
    assert store.client.hget(k.defs, claimed.job.id) is None
    assert store.client.zscore(k.schedule, claimed.job.id) is None
    assert store.client.zscore(k.leases, claimed.job.id) is None
    assert store.client.hget(k.state, claimed.job.id) is None
    # The in-flight run's outcome is still recorded for run history.
    events = store.events()
    assert [(e["id"], e["status"]) for _, e in events] == [(claimed.job.id, "complete")]
    with pytest.raises(JobNotFound):
        store.get(claimed.job.id)
    before = store_snapshot(store)
    assert not store.settle(claimed.job.id, claimed.occurrence, claimed.attempt,
                            "complete").applied
    assert store.reap() == (0, 0, [])
    assert store.claim().jobs == []
    assert store_snapshot(store) == before


def test_settle_for_a_paused_job_records_outcome_without_rescheduling(store: Store) -> None:
    """A paused in-flight job's settle counts the run but leaves it unscheduled."""
    claimed = _claim_one(store)
    assert store.pause(claimed.job.id) == 1
    events_before = store.client.xlen(store.keys.events)
    res = store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "complete")
    assert res.applied and res.status == "paused"
    state = _state(store, claimed.job.id)
    assert (state["s"], state["ls"], state["r"]) == ("paused", "complete", 1)
    assert store.client.zscore(store.keys.schedule, claimed.job.id) is None
    assert store.client.zscore(store.keys.leases, claimed.job.id) is None
    assert store.client.xlen(store.keys.events) == events_before + 1
    assert store.client.hget(store.keys.counters, "complete") == "1"
    assert store.claim().jobs == []
    # Resuming schedules it again, from now.
    assert store.resume(claimed.job.id) == 1
    assert [c.job.id for c in store.claim().jobs] == [claimed.job.id]


def test_settle_script_refuses_a_next_due_computed_from_an_old_definition(store: Store) -> None:
    """settle.lua answers "changed" (and changes nothing) when the timing signature moved."""
    claimed = _claim_one(store)
    k = store.keys
    before = store_snapshot(store)
    res = store.client.eval(
        _lua("settle"), 7, k.schedule, k.leases, k.state, k.defs, k.paused, k.events,
        k.counters, claimed.job.id, claimed.occurrence, claimed.attempt, "complete", "complete",
        claimed.occurrence + 1, claimed.occurrence + 1, 1, "", "not-the-signature", 0, 1000, "{}")
    assert res == ["changed"]
    assert store_snapshot(store) == before
    ok = store.client.eval(
        _lua("settle"), 7, k.schedule, k.leases, k.state, k.defs, k.paused, k.events,
        k.counters, claimed.job.id, claimed.occurrence, claimed.attempt, "complete", "complete",
        claimed.occurrence + 5, claimed.occurrence + 5, 1, "", claimed.job.timing_signature, 0,
        1000, "{}")
    assert ok[:2] == ["ok", "scheduled"]
    assert store.client.zscore(k.schedule, claimed.job.id) == claimed.occurrence + 5


def test_settle_rejects_an_unknown_outcome(store: Store) -> None:
    """Only complete, error and skip are outcomes."""
    claimed = _claim_one(store)
    with pytest.raises(ValueError, match="unknown outcome"):
        store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "done")


# ---------------------------------------------------------------------- reap
def test_expired_lease_is_redelivered_with_same_occurrence_attempt_and_task_id(
    make_store: Callable[..., Store],
) -> None:
    """Reap returns an unsettled occurrence as-is: same occurrence, attempt and task id."""
    store = make_store(lease_s=0.05)
    first = _claim_one(store)
    assert store.reap() == (0, 0, [])  # the lease is still live
    time.sleep(0.1)
    assert store.reap() == (1, 0, [first.job.id])
    assert store.client.zscore(store.keys.schedule, first.job.id) == first.due_ms
    second = store.claim().jobs[0]
    assert (second.occurrence, second.attempt, second.due_ms) == (
        first.occurrence, first.attempt, first.due_ms)
    assert second.task_id == first.task_id == task_id_for(first.job.id, first.occurrence, 1)
    assert (first.deliveries, second.deliveries) == (1, 2)
    assert store.client.hget(store.keys.counters, "redelivered") == "1"
    # The redelivered occurrence settles normally.
    assert store.settle(second.job.id, second.occurrence, second.attempt, "complete").applied


def test_job_is_dead_lettered_after_max_deliveries(make_store: Callable[..., Store]) -> None:
    """After max_deliveries unsettled deliveries the job is dead, not scheduled."""
    store = make_store(lease_s=0.05, max_deliveries=3)
    claimed = _claim_one(store)
    for delivery in (2, 3):
        time.sleep(0.07)
        assert store.reap() == (1, 0, [claimed.job.id])
        again = store.claim().jobs[0]
        assert (again.deliveries, again.task_id) == (delivery, claimed.task_id)
    time.sleep(0.07)
    assert store.reap() == (0, 1, [claimed.job.id])
    k = store.keys
    assert store.client.zscore(k.dead, claimed.job.id) is not None
    assert store.client.zscore(k.schedule, claimed.job.id) is None
    assert store.client.zscore(k.leases, claimed.job.id) is None
    assert _state(store, claimed.job.id)["s"] == "dead"
    assert store.get(claimed.job.id).status == "dead"
    assert store.client.hget(k.counters, "dead") == "1"
    assert store.claim().jobs == []
    # A settle arriving from a dead occurrence changes nothing.
    before = store_snapshot(store)
    assert not store.settle(claimed.job.id, claimed.occurrence, claimed.attempt,
                            "complete").applied
    assert store_snapshot(store) == before


def test_reap_of_deleted_in_flight_job_does_not_redeliver(make_store: Callable[..., Store]) -> None:
    """A job deleted while in flight is forgotten when its lease expires."""
    store = make_store(lease_s=0.05)
    claimed = _claim_one(store)
    store.delete(claimed.job.id)
    time.sleep(0.07)
    assert store.reap() == (0, 0, [])
    assert store.client.zcard(store.keys.leases) == 0
    assert store.client.hlen(store.keys.state) == 0
    assert store.claim().jobs == []


# -------------------------------------------------------------------- extend
def test_extend_pushes_back_the_lease_of_the_current_attempt_only(
    make_store: Callable[..., Store],
) -> None:
    """extend.lua moves the lease to now + seconds; stale callers get False."""
    store = make_store(lease_s=0.05)
    claimed = _claim_one(store)
    job_id = claimed.job.id
    assert store.extend(job_id, claimed.occurrence, claimed.attempt, 30)
    lease = store.client.zscore(store.keys.leases, job_id)
    assert lease is not None and 29_000 <= lease - store.now_ms() <= 30_000
    time.sleep(0.07)
    assert store.reap() == (0, 0, [])
    assert not store.extend(job_id, claimed.occurrence, claimed.attempt + 1, 60)
    assert not store.extend(job_id, claimed.occurrence - 1, claimed.attempt, 60)
    assert not store.extend("nope", claimed.occurrence, claimed.attempt, 60)
    assert store.client.zscore(store.keys.leases, job_id) == lease
    assert store.settle(job_id, claimed.occurrence, claimed.attempt, "complete").applied
    assert not store.extend(job_id, claimed.occurrence, claimed.attempt, 60)
    assert store.client.zscore(store.keys.leases, job_id) is None


# ------------------------------------------------------------------- release
def test_release_returns_unpublished_jobs_without_counting_a_delivery(store: Store) -> None:
    """release.lua puts a claimed job back at its due time; deliveries are not counted."""
    claimed = _claim_one(store)
    assert store.release([claimed]) == 1
    k = store.keys
    assert store.client.zscore(k.schedule, claimed.job.id) == claimed.due_ms
    assert store.client.zscore(k.leases, claimed.job.id) is None
    state = _state(store, claimed.job.id)
    assert (state["s"], state["d"]) == ("scheduled", 0)
    again = store.claim().jobs[0]
    assert (again.occurrence, again.attempt, again.deliveries) == (
        claimed.occurrence, claimed.attempt, 1)
    assert again.task_id == claimed.task_id
    assert store.release([]) == 0


def test_release_of_a_settled_claim_changes_nothing(store: Store) -> None:
    """A release that comes after the settle (or names another attempt) is a no-op."""
    claimed = _claim_one(store)
    assert store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "complete").applied
    before = store_snapshot(store)
    assert store.release([claimed]) == 0
    assert store_snapshot(store) == before


# ------------------------------------------------------------------- control
def test_pause_of_a_leased_job_leaves_the_lease_and_occurrence_alone(store: Store) -> None:
    """Pausing an in-flight job changes only what happens after its settle."""
    claimed = _claim_one(store)
    lease = store.client.zscore(store.keys.leases, claimed.job.id)
    state = _state(store, claimed.job.id)
    assert store.pause(claimed.job.id) == 1
    assert store.client.zscore(store.keys.leases, claimed.job.id) == lease
    assert _state(store, claimed.job.id) == state
    assert store.client.sismember(store.keys.paused, claimed.job.id)
    assert store.extend(claimed.job.id, claimed.occurrence, claimed.attempt, 60)


def test_delete_of_a_leased_job_leaves_the_lease_alone(store: Store) -> None:
    """Deleting an in-flight job removes its definition but not its lease or occurrence."""
    claimed = _claim_one(store)
    lease = store.client.zscore(store.keys.leases, claimed.job.id)
    state = _state(store, claimed.job.id)
    assert store.delete(claimed.job.id) == 1
    assert store.client.hget(store.keys.defs, claimed.job.id) is None
    assert store.client.zscore(store.keys.leases, claimed.job.id) == lease
    assert _state(store, claimed.job.id) == state
    with pytest.raises(JobNotFound):
        store.get(claimed.job.id)


def test_recreating_a_job_deleted_in_flight_continues_from_its_occurrence(store: Store) -> None:
    """Re-adding a job whose deleted occurrence is still in flight adds no second message."""
    claimed = _claim_one(store)
    store.delete(claimed.job.id)
    report = store.upsert(claimed.job)
    assert (report.created, report.updated, report.rescheduled) == (1, 0, 0)
    assert store.client.zscore(store.keys.schedule, claimed.job.id) is None
    assert store.claim().jobs == []
    res = store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "complete")
    assert res.applied and res.status == "scheduled"
    assert store.client.zscore(store.keys.schedule, claimed.job.id) == res.next_due_ms


def test_delete_of_a_scheduled_job_removes_every_trace(store: Store) -> None:
    """A job that is not in flight is removed from every key."""
    store.upsert(_job("gone"), static=True)
    store.upsert(_job("kept"))
    store.pause("gone")
    assert store.delete("gone") == 1
    snap = store_snapshot(store)
    assert list(snap["defs"]) == ["kept"]
    assert list(snap["state"]) == ["kept"]
    assert [m for m, _ in snap["schedule"]] == ["kept"]
    assert snap["paused"] == set() and snap["static"] == set()
    with pytest.raises(JobNotFound):
        store.delete("gone")


def test_run_now_of_an_in_flight_job_is_a_no_op(store: Store) -> None:
    """run_now never adds a second occurrence while one is in flight."""
    claimed = _claim_one(store)
    before = store_snapshot(store)
    assert store.run_now(claimed.job.id) == 0
    assert store_snapshot(store) == before
    assert store.claim().jobs == []


def test_run_now_makes_a_future_job_due_now(store: Store) -> None:
    """run_now moves a scheduled job to the Redis clock's now, as a fresh occurrence."""
    claimed = _claim_one(store)
    store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "complete")
    assert store.claim().jobs == []
    assert store.run_now(claimed.job.id) == 1
    batch = store.claim()
    assert [c.job.id for c in batch.jobs] == [claimed.job.id]
    now_job = batch.jobs[0]
    assert 0 <= batch.now_ms - now_job.due_ms < 1000
    assert now_job.occurrence == now_job.due_ms
    assert (now_job.attempt, now_job.deliveries) == (1, 1)


def test_pause_and_resume_of_a_scheduled_job(store: Store) -> None:
    """A paused job is unscheduled; resume schedules it again; both are idempotent."""
    store.upsert(_job("p"))
    assert store.pause("p") == 1
    assert store.pause("p") == 0
    assert store.client.zscore(store.keys.schedule, "p") is None
    assert store.get("p").paused and store.get("p").status == "paused"
    assert store.claim().jobs == []
    assert store.resume("p") == 1
    assert store.resume("p") == 0
    info = store.get("p")
    assert not info.paused and info.status == "scheduled" and info.due_ms is not None
    assert [c.job.id for c in store.claim().jobs] == ["p"]


def test_reset_failures_zeroes_counters_and_revives_a_dead_job(
    make_store: Callable[..., Store],
) -> None:
    """reset_failures clears the failure streak and brings a dead-lettered job back, due now."""
    store = make_store(lease_s=0.05, max_deliveries=1, retry_max=0)
    claimed = _claim_one(store)
    time.sleep(0.07)
    assert store.reap() == (0, 1, [claimed.job.id])
    state = _state(store, claimed.job.id)
    state.update(c=4, f=9, e="boom")
    store.client.hset(store.keys.state, claimed.job.id, json.dumps(state))
    assert store.reset_failures(claimed.job.id) == 1
    state = _state(store, claimed.job.id)
    assert (state["c"], state["f"], state["s"], "e" in state) == (0, 0, "scheduled", False)
    assert store.client.zscore(store.keys.dead, claimed.job.id) is None
    revived = store.claim().jobs
    assert [c.job.id for c in revived] == [claimed.job.id]
    assert revived[0].occurrence != claimed.occurrence
    assert revived[0].deliveries == 1


def test_control_script_rejects_an_unknown_operation(store: Store) -> None:
    """control.lua answers an error for an operation it does not know, and changes nothing."""
    store.upsert(_job("c"))
    before = store_snapshot(store)
    k = store.keys
    with pytest.raises(redis.ResponseError, match="unknown operation"):
        store.client.eval(_lua("control"), 7, k.defs, k.schedule, k.leases, k.state, k.paused,
                          k.dead, k.static, "explode", "c", 0)
    assert store_snapshot(store) == before
    res = store.client.eval(_lua("control"), 7, k.defs, k.schedule, k.leases, k.state, k.paused,
                            k.dead, k.static, "pause", "c", 0, "missing", 0)
    assert res == [1, "missing"]


def test_control_on_many_ids_reports_changes_and_ignores_missing(store: Store) -> None:
    """Bulk control ops count what changed; a missing id among many is skipped."""
    store.upsert_many([_job(f"m{i}") for i in range(3)], stagger=False)
    assert store.pause("m0", "m1", "missing") == 2
    with pytest.raises(JobNotFound):
        store.pause("missing")
    assert store.resume("m0", "m1", "m2") == 2


# -------------------------------------------------------------------- upsert
def test_reupsert_of_an_unchanged_job_does_not_move_its_schedule(store: Store) -> None:
    """Storing the same definition again keeps its due time (ZADD NX)."""
    claimed = _claim_one(store)
    store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "complete")
    due = store.client.zscore(store.keys.schedule, claimed.job.id)
    before = store_snapshot(store)
    report = store.upsert(claimed.job)
    assert (report.created, report.updated, report.rescheduled) == (0, 1, 0)
    assert store.client.zscore(store.keys.schedule, claimed.job.id) == due
    assert store_snapshot(store) == before


def test_changed_interval_moves_the_schedule(store: Store) -> None:
    """A new interval reschedules a job that is not in flight."""
    claimed = _claim_one(store)
    store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "complete")
    old_due = store.client.zscore(store.keys.schedule, claimed.job.id)
    assert old_due is not None and old_due - store.now_ms() > 50_000
    report = store.upsert(_job(interval_s=10))
    assert (report.created, report.updated, report.rescheduled) == (0, 1, 1)
    new_due = store.client.zscore(store.keys.schedule, claimed.job.id)
    assert new_due is not None and abs(new_due - store.now_ms()) < 1000
    assert store.get(claimed.job.id).job.interval_s == 10
    state = _state(store, claimed.job.id)
    assert (state["o"], state["a"], state["s"]) == (new_due, 1, "scheduled")


def test_changed_definition_is_updated_without_moving_the_schedule(store: Store) -> None:
    """A new meta/kwargs is stored; the due time stays."""
    store.upsert(_job("d", meta={"v": 1}))
    store.client.zadd(store.keys.schedule, {"d": 123_456}, xx=True)
    report = store.upsert(_job("d", meta={"v": 2}, kwargs={"x": 1}))
    assert (report.created, report.updated, report.rescheduled) == (0, 1, 0)
    stored = Job.from_json(store.client.hget(store.keys.defs, "d") or "")
    assert (stored.meta, stored.kwargs) == ({"v": 2}, {"x": 1})
    assert store.client.zscore(store.keys.schedule, "d") == 123_456


def test_edit_of_an_in_flight_job_applies_from_its_settle(store: Store) -> None:
    """A timing edit never touches the occurrence in flight; its settle uses the new timing."""
    claimed = _claim_one(store)
    lease = store.client.zscore(store.keys.leases, claimed.job.id)
    report = store.upsert(_job(interval_s=10))
    assert report.rescheduled == 0
    assert store.client.zscore(store.keys.schedule, claimed.job.id) is None
    assert store.client.zscore(store.keys.leases, claimed.job.id) == lease
    res = store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "complete")
    assert res.applied and res.next_due_ms is not None and res.now_ms is not None
    assert 0 <= res.now_ms + 10_000 - res.next_due_ms < 50


def test_disabled_job_is_stored_paused_and_enabling_schedules_it(store: Store) -> None:
    """enabled=false stores the definition without scheduling it."""
    report = store.upsert(_job("off", enabled=False))
    assert report.created == 1
    assert store.client.zscore(store.keys.schedule, "off") is None
    assert store.client.sismember(store.keys.paused, "off")
    assert store.upsert(_job("off")).rescheduled == 1
    assert store.client.zscore(store.keys.schedule, "off") is not None
    assert not store.client.sismember(store.keys.paused, "off")


# ---------------------------------------------------------------------- clock
def test_every_time_comes_from_redis_time(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Due times, claims, leases and settles use Redis TIME, whatever the host clock says."""
    real_time = time.time

    def redis_ms() -> int:
        sec, usec = store.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    for skew_s in (5 * 3600.0, -5 * 3600.0):
        monkeypatch.setattr(time, "time", lambda skew=skew_s: real_time() + skew)
        assert abs(time.time() * 1000 - redis_ms()) > 4 * 3600 * 1000
        job = _job(f"clock{int(skew_s)}")
        store.upsert(job)
        due = store.client.zscore(store.keys.schedule, job.id)
        assert due is not None and abs(due - redis_ms()) < 50
        # Not yet due on the Redis clock, however far the host clock runs ahead.
        store.client.zadd(store.keys.schedule, {job.id: redis_ms() + 2_000}, xx=True)
        assert store.claim().jobs == []
        store.client.zadd(store.keys.schedule, {job.id: redis_ms() - 1}, xx=True)
        batch = store.claim(lease_s=30)
        assert [c.job.id for c in batch.jobs] == [job.id]
        assert abs(batch.now_ms - redis_ms()) < 50
        assert store.client.zscore(store.keys.leases, job.id) == batch.now_ms + 30_000
        assert abs(store.now_ms() - redis_ms()) < 50
        claimed = batch.jobs[0]
        res = store.settle(job.id, claimed.occurrence, claimed.attempt, "complete")
        assert res.now_ms is not None and abs(res.now_ms - redis_ms()) < 50
        assert res.next_due_ms is not None
        assert 0 <= res.now_ms + 60_000 - res.next_due_ms < 50


def test_resume_after_end_at_finishes_instead_of_running_once_more(store: Store) -> None:
    """Resuming a paused job whose end_at has passed leaves it finished, not due."""
    soon = datetime.now(timezone.utc) + timedelta(milliseconds=300)
    job = Job.from_dict({"id": "ends", "task": "t", "interval_s": 60, "end_at": soon.isoformat()})
    store.upsert(job)
    store.pause(job.id)
    time.sleep(0.4)
    store.resume(job.id)
    info = store.get(job.id)
    assert info.status == "finished"
    assert info.due_ms is None
    assert not info.paused
    assert store.claim().jobs == []
