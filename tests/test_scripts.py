"""Each Lua script, proven directly against the throwaway Redis.

Scripts are driven through :class:`Store` and, where the wire format matters,
called with raw KEYS/ARGV. Key names always come from ``store.keys``.
"""

from __future__ import annotations

import json
import multiprocessing
import re
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from importlib import resources
from typing import Any

import pytest
import redis

from celery_zsched.config import Settings
from celery_zsched.core.errors import JobNotFound
from celery_zsched.core.job import Job
from celery_zsched.core.state import RuntimeState
from celery_zsched.store import Claimed, ReapResult, Store, scripts, task_id_for
from celery_zsched.store.keys import Keys
from tests.helpers import store_snapshot


def _job(job_id: str = "j1", **fields: Any) -> Job:
    data: dict[str, Any] = {"id": job_id, "task": "tests.noop", "interval_s": 60, "jitter_s": 0}
    data.update(fields)
    return Job.from_dict(data)


def _claim_one(store: Store, job: Job | None = None) -> Claimed:
    """Store a job and claim it: it is queued (published and confirmed, as beat does, not
    started)."""
    job = job or _job()
    store.upsert(job)
    batch = store.claim()
    assert [c.job.id for c in batch.jobs] == [job.id]
    assert store.routed([(batch.jobs[0], "")]) == 1
    return batch.jobs[0]


def _run_one(store: Store, job: Job | None = None) -> Claimed:
    """Store, claim and start a job: it is running under an execution lease."""
    claimed = _claim_one(store, job)
    assert store.start(claimed.job.id, claimed.occurrence, claimed.attempt).runs
    return claimed


def _state(store: Store, job_id: str) -> RuntimeState:
    raw = store.client.hget(store.keys.state, job_id)
    assert raw is not None, f"no state for {job_id}"
    return RuntimeState.from_wire(raw)


def _write_state(store: Store, job_id: str, state: RuntimeState) -> None:
    """Overwrite a job's state as a script (or an older version of one) would have."""
    store.client.hset(store.keys.state, job_id, json.dumps(state.to_wire()))


def _make_due(store: Store, job_id: str) -> None:
    """Pretend the clock reached the job's due time (the score is moved, not the state)."""
    store.client.zadd(store.keys.schedule, {job_id: store.now_ms() - 1}, xx=True)
    assert store.client.zscore(store.keys.schedule, job_id) is not None


def _lua(name: str) -> str:
    """The script as Redis runs it (with the shared prelude)."""
    return scripts.source(name)


# ------------------------------------------------------------------ registry
@pytest.mark.parametrize("spec", list(scripts.SCRIPTS.values()), ids=list(scripts.SCRIPTS))
def test_each_script_header_documents_the_keys_and_argv_its_spec_declares(
        spec: scripts.ScriptSpec[Any]) -> None:
    """The one Python declaration of a script and its Lua header name the same KEYS, in order,
    and as many ARGV values (the repeated group as "groups of N")."""
    lua = resources.files("celery_zsched.store").joinpath("lua")
    text = lua.joinpath(f"{spec.name}.lua").read_text("utf-8")
    header = [line for line in text.splitlines() if line.startswith("--")]
    keys = [re.match(r"-- KEYS\[(\d+)\]\s+(\w+)", line) for line in header]
    assert [(int(m[1]), m[2]) for m in keys if m] == list(enumerate(spec.keys, 1))
    argv = [int(m[1]) for line in header if (m := re.match(r"-- ARGV\[(\d+)\]\s", line))]
    assert argv == list(range(1, len(spec.args) + 1))
    if spec.group:
        assert f"groups of {len(spec.group)}" in "\n".join(header)
    for name in spec.keys:
        assert hasattr(Keys, name), name


def test_a_script_call_with_a_missing_unknown_or_misshapen_argument_is_refused() -> None:
    """The registry refuses what would make a script read the wrong ARGV slot."""
    with pytest.raises(TypeError, match="missing"):
        scripts.START.argv({"id": "j"})
    with pytest.raises(TypeError, match="unknown"):
        scripts.CLAIM.argv({"limit": 1, "delivery_ms": 1, "bound": 1, "lease_ms": 5})
    with pytest.raises(TypeError, match="row"):
        scripts.RELEASE.argv({"status": "queued"}, [("j", 1)])
    assert scripts.RELEASE.argv({"status": "queued"}, [("j", 1, 2), ("k", 3, 4)]) == [
        "queued", "j", 1, 2, "k", 3, 4]


def test_every_script_loads_with_the_prelude_and_no_script_reads_time_itself() -> None:
    """now_ms and the state encoding live once, in the prelude."""
    lua = resources.files("celery_zsched.store").joinpath("lua")
    for name in scripts.SCRIPTS:
        body = lua.joinpath(f"{name}.lua").read_text("utf-8")
        code = "\n".join(line for line in body.splitlines() if not line.startswith("--"))
        assert 'redis.call("TIME")' not in code and "cjson" not in code, name
        assert scripts.source(name).startswith(lua.joinpath("_prelude.lua").read_text("utf-8"))


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
    # Five queues: each one's default bound (2,000) admits its share, so with the
    # default settings every job is claimed, and each queue's count is exact.
    jobs = [_job(f"job-{i:05d}", queue=f"q{i % 5}") for i in range(10_000)]
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
    assert store.client.hgetall(store.keys.queue_in_flight) == {f"q{i}": "2000" for i in range(5)}
    assert store.client.zcard(store.keys.schedule) == 0
    assert store.client.zcard(store.keys.queued) == 10_000
    assert store.client.hget(store.keys.counters, "promoted") == "10000"


def test_claim_script_with_raw_keys_returns_documented_layout(store: Store) -> None:
    """claim.lua returns {now, next_due, next_deadline, room, held, held by their queue's
    bound, then per job id, def, occ, attempt, publishes, due, fence, validators}."""
    job = _job("raw-claim")
    later = _job("later")
    store.upsert(job)
    store.upsert(later)
    later_due = store.now_ms() + 3_600_000
    store.client.zadd(store.keys.schedule, {later.id: later_due})
    due = int(store.client.zscore(store.keys.schedule, job.id) or 0)
    k = store.keys
    res = store.client.eval(_lua("claim"), 10, k.schedule, k.queued, k.leases, k.state, k.defs,
                            k.counters, k.domains, k.domain_conf, k.queue_in_flight,
                            k.queue_held, 10, 20_000, 50, "", "queued", "", 5)
    sec, usec = store.client.time()
    redis_now = sec * 1000 + usec // 1000
    now, next_due, next_lease, room = res[0], res[1], res[2], res[3]
    assert 0 <= redis_now - now < 1000
    assert next_due == later_due
    assert next_lease == now + 20_000
    assert room == 49
    assert res[4] == 0  # held back by pacing (off here)
    assert res[5] == 0  # held back by their queue's bound (5 here)
    # Fence 0: no start yet; "": no validators from an earlier visit.
    assert res[6:] == [job.id, job.to_json(), due, 1, 1, due, 0, ""]
    assert store.client.hgetall(k.queue_in_flight) == {"": "1"}
    assert store.client.zscore(k.queued, job.id) == now + 20_000
    assert store.client.zscore(k.leases, job.id) is None
    assert _state(store, job.id).status == "queued"
    # Nothing due: the lists are empty and next_due/next_deadline still reported.
    again = store.client.eval(_lua("claim"), 10, k.schedule, k.queued, k.leases, k.state,
                              k.defs, k.counters, k.domains, k.domain_conf, k.queue_in_flight,
                              k.queue_held, 10, 20_000, 50, "", "queued", "", 5)
    assert again[1:] == [later_due, now + 20_000, 49, 0, 0]


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
    assert store.client.zcard(store.keys.queued) == 0


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
    assert _state(store, old.job.id).status == "queued"


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
    assert store.reap() == ReapResult()
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
    assert (state.status, state.last_outcome, state.runs) == ("paused", "complete", 1)
    assert store.client.zscore(store.keys.schedule, claimed.job.id) is None
    assert store.client.zscore(store.keys.leases, claimed.job.id) is None
    assert store.client.xlen(store.keys.events) == events_before + 1
    assert store.client.hget(store.keys.counters, "complete") == "1"
    assert store.claim().jobs == []
    # Resuming schedules it again, one interval after its last run (never early).
    assert store.resume(claimed.job.id) == 1
    assert store.client.zscore(store.keys.schedule, claimed.job.id) == res.now_ms + 60_000
    assert store.claim().jobs == []


def test_settle_script_refuses_a_next_due_computed_from_an_old_definition(store: Store) -> None:
    """settle.lua answers "changed" (and changes nothing) when the timing signature moved."""
    claimed = _claim_one(store)
    k = store.keys
    before = store_snapshot(store)
    res = store.client.eval(
        _lua("settle"), 12, k.schedule, k.leases, k.state, k.defs, k.paused, k.events,
        k.counters, k.queued, k.domains, k.domain_conf, k.http_schedule, k.http_wake,
        claimed.job.id, claimed.occurrence, claimed.attempt, "complete",
        "complete",
        claimed.occurrence + 1, claimed.occurrence + 1, 1, "", "not-the-signature", 0, 1000, "{}")
    assert res == ["changed"]
    assert store_snapshot(store) == before
    ok = store.client.eval(
        _lua("settle"), 12, k.schedule, k.leases, k.state, k.defs, k.paused, k.events,
        k.counters, k.queued, k.domains, k.domain_conf, k.http_schedule, k.http_wake,
        claimed.job.id, claimed.occurrence, claimed.attempt, "complete",
        "complete",
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
    """A running occurrence whose execution lease ended comes back as-is: same task id."""
    store = make_store(lease_s=0.05)
    first = _run_one(store)
    assert store.reap() == ReapResult()  # the lease is still live
    time.sleep(0.1)
    assert store.reap() == ReapResult(redelivered=1, ids=(first.job.id,))
    assert store.client.zscore(store.keys.schedule, first.job.id) == first.due_ms
    second = store.claim().jobs[0]
    assert (second.occurrence, second.attempt, second.due_ms) == (
        first.occurrence, first.attempt, first.due_ms)
    assert second.task_id == first.task_id == task_id_for(first.job.id, first.occurrence, 1)
    assert (first.deliveries, second.deliveries) == (1, 2)
    assert _state(store, first.job.id).crashes == 1
    assert store.client.hget(store.keys.counters, "redelivered") == "1"
    # The redelivered occurrence starts and settles normally.
    assert store.start(second.job.id, second.occurrence, second.attempt).runs
    assert store.settle(second.job.id, second.occurrence, second.attempt, "complete").applied


def test_job_is_dead_lettered_after_max_deliveries(make_store: Callable[..., Store]) -> None:
    """After max_deliveries crashed executions the job is dead, not scheduled."""
    store = make_store(lease_s=0.05, max_deliveries=3)
    claimed = _run_one(store)
    for delivery in (2, 3):
        time.sleep(0.07)
        assert store.reap() == ReapResult(redelivered=1, ids=(claimed.job.id,))
        again = store.claim().jobs[0]
        assert (again.deliveries, again.task_id) == (delivery, claimed.task_id)
        assert store.start(again.job.id, again.occurrence, again.attempt).runs
    time.sleep(0.07)
    assert store.reap() == ReapResult(dead=1, ids=(claimed.job.id,), dead_ids=(claimed.job.id,))
    k = store.keys
    assert store.client.zscore(k.dead, claimed.job.id) is not None
    assert store.client.zscore(k.schedule, claimed.job.id) is None
    assert store.client.zscore(k.leases, claimed.job.id) is None
    assert _state(store, claimed.job.id).status == "dead"
    assert store.get(claimed.job.id).status == "dead"
    assert store.client.hget(k.counters, "dead") == "1"
    assert store.claim().jobs == []
    # A settle arriving from a dead occurrence changes nothing.
    before = store_snapshot(store)
    assert not store.settle(claimed.job.id, claimed.occurrence, claimed.attempt,
                            "complete").applied
    assert store_snapshot(store) == before


def test_reap_of_deleted_in_flight_job_does_not_redeliver(make_store: Callable[..., Store]) -> None:
    """A job deleted while running is forgotten when its execution lease expires."""
    store = make_store(lease_s=0.05)
    claimed = _run_one(store)
    store.delete(claimed.job.id)
    time.sleep(0.07)
    assert store.reap() == ReapResult()
    assert store.client.zcard(store.keys.leases) == 0
    assert store.client.hlen(store.keys.state) == 0
    assert store.claim().jobs == []


def test_waiting_past_the_delivery_deadline_with_no_worker_alive_is_not_a_failure(
    make_store: Callable[..., Store],
) -> None:
    """No live worker: a message past its delivery deadline is only waiting. It is held, not
    republished, and counts nothing toward dead-lettering, however many times it happens."""
    store = make_store(delivery_timeout_s=0.05, max_deliveries=1)
    claimed = _claim_one(store)
    for _ in range(3):
        time.sleep(0.07)
        assert store.reap() == ReapResult(held=1)
    state = _state(store, claimed.job.id)
    assert (state.status, state.crashes, state.publishes) == ("queued", 0, 1)
    assert store.client.zscore(store.keys.schedule, claimed.job.id) is None
    assert store.claim().jobs == []  # no second message
    assert store.client.zcard(store.keys.dead) == 0
    # The message finally starts: it runs once.
    assert store.start(claimed.job.id, claimed.occurrence, claimed.attempt).runs


def test_message_lost_while_a_worker_is_alive_is_republished_with_the_same_task_id(
    make_store: Callable[..., Store],
) -> None:
    """A live worker and a message past its delivery deadline: the broker lost it. The same
    occurrence is republished (same task id) without counting a crash; if the original shows
    up after all, only one of the two runs."""
    store = make_store(delivery_timeout_s=0.05, max_deliveries=1)
    claimed = _claim_one(store)
    time.sleep(0.07)
    assert store.heartbeat([], "w1@host:1") == []
    assert store.reap() == ReapResult(lost=1, ids=(claimed.job.id,))
    assert store.client.hget(store.keys.counters, "lost") == "1"
    again = store.claim().jobs[0]
    assert (again.task_id, again.deliveries) == (claimed.task_id, 2)
    assert _state(store, claimed.job.id).crashes == 0
    assert store.start(again.job.id, again.occurrence, again.attempt).runs
    dup = store.start(claimed.job.id, claimed.occurrence, claimed.attempt)
    assert (dup.status, dup.found) == ("duplicate", "running")
    assert store.client.hget(store.keys.counters, "duplicates") == "1"


def test_a_passed_delivery_deadline_is_held_while_no_worker_consumes_its_queue(
    make_store: Callable[..., Store],
) -> None:
    """Workers of another queue do not make a waiting message look lost: the reaper asks
    about the queue beat routed the occurrence to."""
    store = make_store(delivery_timeout_s=0.05)
    claimed = _claim_one(store)
    assert store.routed([(claimed, "b")]) == 1
    assert _state(store, claimed.job.id).queue == "b"
    store.heartbeat([], "w1@host:1", ["a"])
    for _ in range(2):
        time.sleep(0.07)
        assert store.reap() == ReapResult(held=1)
    store.heartbeat([], "w2@host:2", ["b", "c"])
    time.sleep(0.07)
    assert store.reap() == ReapResult(lost=1, ids=(claimed.job.id,))


def test_entries_leased_under_the_old_meaning_become_queued_on_upgrade(
    make_store: Callable[..., Store],
) -> None:
    """A store written before execution leases ("leased" in the lease set, deliveries counted
    while waiting) loses and strands nothing: the reaper converts each entry to queued with a
    delivery deadline from its promotion and a clean crash count; one a new worker starts runs."""
    store = make_store(delivery_timeout_s=3600, max_deliveries=2)
    jobs = [_job(f"old{i}") for i in range(3)]
    store.upsert_many(jobs, stagger=False)
    now = store.now_ms()
    k = store.keys
    for job in jobs:  # what the old claim.lua wrote, with a lease that just ran out
        store.client.zrem(k.schedule, job.id)
        state = replace(_state(store, job.id), status="leased", crashes=4, due_ms=now - 10,
                        promoted_ms=now - 5)
        _write_state(store, job.id, state)
        store.client.zadd(k.leases, {job.id: now - 1})
    occ = _state(store, "old0").occurrence
    # A new worker starts old0's message before the reaper gets to it.
    assert store.start("old0", occ, 1).runs
    res = store.reap()
    assert (res.converted, res.dead, res.redelivered, res.total) == (2, 0, 0, 0)
    for job_id in ("old1", "old2"):
        state = _state(store, job_id)
        assert (state.status, state.crashes) == ("queued", 0)
        assert store.client.zscore(k.queued, job_id) == now - 5 + 3_600_000
    assert _state(store, "old0").status == "running"
    assert store.start("old1", _state(store, "old1").occurrence, 1).runs
    assert store.settle("old0", occ, 1, "complete").applied
    assert store.client.zcard(k.dead) == 0


# ----------------------------------------------------------------- heartbeat
def test_heartbeat_extends_the_lease_of_the_current_running_attempt_only(
    make_store: Callable[..., Store],
) -> None:
    """heartbeat.lua moves running leases to now + lease_s; it never revives anything else."""
    store = make_store(lease_s=30)
    claimed = _claim_one(store)
    job_id = claimed.job.id
    # Queued, not running: nothing to extend.
    assert store.heartbeat([(job_id, claimed.occurrence, claimed.attempt)]) == [job_id]
    assert store.start(job_id, claimed.occurrence, claimed.attempt).runs
    store.client.zadd(store.keys.leases, {job_id: store.now_ms() + 1000})
    assert store.heartbeat([(job_id, claimed.occurrence, claimed.attempt)], "w") == []
    lease = store.client.zscore(store.keys.leases, job_id)
    assert lease is not None and 29_000 <= lease - store.now_ms() <= 30_000
    stale = [(job_id, claimed.occurrence, claimed.attempt + 1),
             (job_id, claimed.occurrence - 1, claimed.attempt),
             ("nope", claimed.occurrence, claimed.attempt)]
    assert store.heartbeat(stale) == [job_id, job_id, "nope"]
    assert store.client.zscore(store.keys.leases, job_id) == lease
    assert store.settle(job_id, claimed.occurrence, claimed.attempt, "complete").applied
    assert store.heartbeat([(job_id, claimed.occurrence, claimed.attempt)]) == [job_id]
    assert store.client.zscore(store.keys.leases, job_id) is None
    assert store.client.zscore(store.keys.workers, "w") is not None


# --------------------------------------------------------------------- start
def test_start_is_a_compare_and_set_that_lets_exactly_one_delivery_run(store: Store) -> None:
    """Of many deliveries of one occurrence and attempt, exactly one runs; the others find it
    running (or settled) and change nothing."""
    claimed = _claim_one(store)
    args = (claimed.job.id, claimed.occurrence, claimed.attempt)
    first = store.start(*args)
    assert first.runs and first.due_ms == claimed.due_ms
    assert first.promoted_ms == claimed.promoted_ms
    k = store.keys
    assert store.client.zscore(k.queued, claimed.job.id) is None
    lease = store.client.zscore(k.leases, claimed.job.id)
    assert lease is not None and first.now_ms is not None
    assert lease == first.now_ms + store.settings.lease_s * 1000
    before = store_snapshot(store)
    for _ in range(3):
        dup = store.start(*args)
        assert (dup.runs, dup.status, dup.found) == (False, "duplicate", "running")
    assert store_snapshot(store)["state"] == before["state"]
    assert store.client.hget(k.counters, "started") == "1"
    assert store.settle(*args, "complete").applied
    assert store.start(*args).status == "stale"  # a new occurrence is current now
    assert store.start("nope", 1, 1).status == "gone"


def test_start_of_a_message_older_than_its_expiry_reports_expired_on_the_redis_clock(
    store: Store,
) -> None:
    """expires_s is measured from promotion on Redis' clock; the expired delivery does not run
    and its settle records the error."""
    claimed = _claim_one(store)
    args = (claimed.job.id, claimed.occurrence, claimed.attempt)
    state = replace(_state(store, claimed.job.id), promoted_ms=store.now_ms() - 5_000)
    _write_state(store, claimed.job.id, state)
    res = store.start(*args, expires_ms=4_000)
    assert res.status == "expired" and not res.runs
    assert _state(store, claimed.job.id).status == "queued"
    assert store.start(*args, expires_ms=6_000).runs
    settled = store.settle(*args, "error", error="expired")
    assert settled.applied and settled.label == "retrying"


def test_retrying_puts_a_running_attempt_back_to_queued_for_its_celery_retry(store: Store) -> None:
    """A Celery Task.retry is not an outcome: the occurrence is queued again and the retry's
    delivery starts it."""
    claimed = _run_one(store)
    args = (claimed.job.id, claimed.occurrence, claimed.attempt)
    assert store.retrying(*args, countdown_s=10)
    k = store.keys
    assert store.client.zscore(k.leases, claimed.job.id) is None
    deadline = store.client.zscore(k.queued, claimed.job.id)
    expected = 10 + store.settings.delivery_timeout_s
    assert deadline is not None and abs(deadline - store.now_ms() - expected * 1000) < 100
    assert not store.retrying(*args, countdown_s=10)  # not running any more
    assert store.start(*args).runs


def test_claim_holds_due_jobs_in_the_schedule_past_the_backpressure_bound(
    make_store: Callable[..., Store],
) -> None:
    """With max_queued occurrences queued and not started, due jobs stay in the schedule;
    each start frees a slot, and the earliest due is promoted first."""
    store = make_store(max_queued=3, queue_max_queued=3)
    jobs = [_job(f"b{i}") for i in range(6)]
    store.upsert_many(jobs, stagger=False)
    now = store.now_ms()
    for i, job in enumerate(jobs):
        store.client.zadd(store.keys.schedule, {job.id: now - 1000 + i}, xx=True)
    first = store.claim()
    assert [c.job.id for c in first.jobs] == ["b0", "b1", "b2"] and first.room == 0
    held = store.claim()
    assert held.jobs == [] and held.room == 0
    assert held.next_due_ms is not None and held.next_due_ms <= held.now_ms
    assert store.start("b1", first.jobs[1].occurrence, 1).runs
    assert [c.job.id for c in store.claim().jobs] == ["b3"]
    assert store.client.zcard(store.keys.queued) == 3
    assert store.client.zcard(store.keys.schedule) == 2


# ------------------------------------------------------------------- release
def test_release_returns_unpublished_jobs_without_counting_a_delivery(store: Store) -> None:
    """release.lua puts a claimed job back at its due time; deliveries are not counted."""
    claimed = _claim_one(store)
    assert store.release([claimed]) == 1
    k = store.keys
    assert store.client.zscore(k.schedule, claimed.job.id) == claimed.due_ms
    assert store.client.zscore(k.queued, claimed.job.id) is None
    state = _state(store, claimed.job.id)
    assert (state.status, state.publishes) == ("scheduled", 0)
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
    claimed = _run_one(store)
    lease = store.client.zscore(store.keys.leases, claimed.job.id)
    state = _state(store, claimed.job.id)
    assert store.pause(claimed.job.id) == 1
    assert store.client.zscore(store.keys.leases, claimed.job.id) == lease
    assert _state(store, claimed.job.id) == state
    assert store.client.sismember(store.keys.paused, claimed.job.id)
    assert store.heartbeat([(claimed.job.id, claimed.occurrence, claimed.attempt)]) == []


def test_delete_of_a_leased_job_leaves_the_lease_alone(store: Store) -> None:
    """Deleting an in-flight job removes its definition but not its lease or occurrence."""
    claimed = _run_one(store)
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
    claimed = _run_one(store)
    time.sleep(0.07)
    assert store.reap() == ReapResult(dead=1, ids=(claimed.job.id,), dead_ids=(claimed.job.id,))
    state = replace(_state(store, claimed.job.id), consecutive_failures=4, failures=9,
                    last_error="boom")
    _write_state(store, claimed.job.id, state)
    assert store.reset_failures(claimed.job.id) == 1
    state = _state(store, claimed.job.id)
    assert (state.consecutive_failures, state.failures, state.status) == (0, 0, "scheduled")
    assert state.last_error is None
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
    keys = (k.defs, k.schedule, k.leases, k.state, k.paused, k.dead, k.static, k.queued,
            k.audit, k.http_schedule, k.http_wake, k.tombstones, k.tombstone_expiry)
    with pytest.raises(redis.ResponseError, match="unknown operation"):
        store.client.eval(_lua("control"), len(keys), *keys,
                          "explode", 0, "api", "", "", 1000, "c", 0, "")
    assert store_snapshot(store) == before
    res = store.client.eval(_lua("control"), len(keys), *keys,
                            "pause", 0, "api", "", "", 1000, "c", 0, "", "missing", 0, "")
    assert res == [1, 0, "missing"]


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
    """A new interval reschedules a job that is not in flight: from its last run under the new
    timing, never earlier (a shorter interval does not make it due at once)."""
    claimed = _claim_one(store)
    settled = store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "complete")
    assert settled.now_ms is not None
    old_due = store.client.zscore(store.keys.schedule, claimed.job.id)
    assert old_due is not None and old_due - store.now_ms() > 50_000
    report = store.upsert(_job(interval_s=10))
    assert (report.created, report.updated, report.rescheduled) == (0, 1, 1)
    new_due = store.client.zscore(store.keys.schedule, claimed.job.id)
    assert new_due == settled.now_ms + 10_000
    assert store.get(claimed.job.id).job.interval_s == 10
    state = _state(store, claimed.job.id)
    assert (state.occurrence, state.attempt, state.status) == (new_due, 1, "scheduled")


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
    claimed = _run_one(store)
    lease = store.client.zscore(store.keys.leases, claimed.job.id)
    report = store.upsert(_job(interval_s=10))
    assert report.rescheduled == 0
    assert store.client.zscore(store.keys.schedule, claimed.job.id) is None
    assert store.client.zscore(store.keys.leases, claimed.job.id) == lease
    res = store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "complete")
    assert res.applied and res.next_due_ms is not None and res.now_ms is not None
    # The new 10 s interval, not the old 60 s: a second of slack for the round trip
    # between the clock read that computes the next run and the settle script.
    assert 0 <= res.now_ms + 10_000 - res.next_due_ms < 1000


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
    # The host clock is 5 h off; a second of slack for a loaded machine's round trips
    # cannot hide that.
    slack = 1000

    def redis_ms() -> int:
        sec, usec = store.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    for skew_s in (5 * 3600.0, -5 * 3600.0):
        monkeypatch.setattr(time, "time", lambda skew=skew_s: real_time() + skew)
        assert abs(time.time() * 1000 - redis_ms()) > 4 * 3600 * 1000
        job = _job(f"clock{int(skew_s)}")
        store.upsert(job)
        due = store.client.zscore(store.keys.schedule, job.id)
        assert due is not None and abs(due - redis_ms()) < slack
        # Not yet due on the Redis clock, however far the host clock runs ahead.
        store.client.zadd(store.keys.schedule, {job.id: redis_ms() + 2_000}, xx=True)
        assert store.claim().jobs == []
        store.client.zadd(store.keys.schedule, {job.id: redis_ms() - 1}, xx=True)
        batch = store.claim()
        assert [c.job.id for c in batch.jobs] == [job.id]
        assert abs(batch.now_ms - redis_ms()) < slack
        publish_ms = store.settings.publish_timeout_s * 1000
        assert store.client.zscore(store.keys.queued, job.id) == batch.now_ms + publish_ms
        assert abs(store.now_ms() - redis_ms()) < slack
        claimed = batch.jobs[0]
        started = store.start(job.id, claimed.occurrence, claimed.attempt)
        assert started.now_ms is not None and abs(started.now_ms - redis_ms()) < slack
        lease = store.client.zscore(store.keys.leases, job.id)
        assert lease == started.now_ms + store.settings.lease_s * 1000
        res = store.settle(job.id, claimed.occurrence, claimed.attempt, "complete")
        assert res.now_ms is not None and abs(res.now_ms - redis_ms()) < slack
        assert res.next_due_ms is not None
        assert 0 <= res.now_ms + 60_000 - res.next_due_ms < slack


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
