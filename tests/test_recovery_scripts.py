"""Recovery and fencing, proven on the scripts against the throwaway Redis.

What a dead process held comes back within a short deadline: a claim whose
beat died before confirming the publish (the publish deadline), and a message
a worker received and held unstarted when it died (the hold, one lease). And
what a process that only looked dead does afterwards changes nothing: every
execution is numbered by its start (or the gateway's claim), and heartbeat,
retry and settle must present that number (fencing). A message that was never
promoted so, or names another task, is refused at start and changes nothing.

The end-to-end proofs with real processes and the default timeouts are in
``tests/e2e/test_recovery.py``; these pin each script's rule directly, with
short deadlines where waiting one out is the point.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from celery_zsched.core.job import Job
from celery_zsched.core.state import RuntimeState
from celery_zsched.store import Claimed, ReapResult, Store
from tests.helpers import store_snapshot


def _job(job_id: str = "j1", **fields: Any) -> Job:
    data: dict[str, Any] = {"id": job_id, "task": "tests.noop", "interval_s": 60, "jitter_s": 0}
    data.update(fields)
    return Job.from_dict(data)


def _state(store: Store, job_id: str) -> RuntimeState:
    return RuntimeState.from_wire(store.client.hget(store.keys.state, job_id))


def _claimed(store: Store, job: Job | None = None, *, routed: bool = True) -> Claimed:
    job = job or _job()
    store.upsert(job)
    [claimed] = store.claim().jobs
    if routed:
        assert store.routed([(claimed, "")]) == 1
    return claimed


def _deadline(store: Store, job_id: str) -> int:
    score = store.client.zscore(store.keys.queued, job_id)
    assert score is not None
    return int(score)


def _held(claimed: Claimed, task: str = "tests.noop") -> tuple[str, int, int, int, str]:
    return (claimed.job.id, claimed.occurrence, claimed.attempt, claimed.deliveries, task)


def _wait_past(store: Store, ms: int) -> None:
    while store.now_ms() <= ms:
        time.sleep(0.01)


def _without_counters(snapshot: dict[str, Any]) -> dict[str, Any]:
    """What a job is: the snapshot but for the counters (and the key count, which a counters
    hash or a worker's liveness entry created meanwhile changes)."""
    return {k: v for k, v in snapshot.items() if k not in ("counters", "keys")}


# -------------------------------------------------------------- publish deadline
def test_a_claim_waits_under_the_publish_deadline_until_beat_confirms_the_publish(
        store: Store) -> None:
    claimed = _claimed(store, routed=False)
    publish_ms = int(store.settings.publish_timeout_s * 1000)
    assert _deadline(store, claimed.job.id) == claimed.promoted_ms + publish_ms
    assert _state(store, claimed.job.id).queue is None  # not confirmed
    before = store.now_ms()
    assert store.routed([(claimed, "q1")]) == 1
    st = _state(store, claimed.job.id)
    assert (st.queue, st.task) == ("q1", "tests.noop")
    delivery_ms = int(store.settings.delivery_timeout_s * 1000)
    assert before + delivery_ms <= _deadline(store, claimed.job.id) <= store.now_ms() + delivery_ms


def test_a_claim_whose_beat_died_before_the_publish_is_due_again_at_its_publish_deadline(
        make_store: Callable[..., Store]) -> None:
    """No worker is alive and none consumes anything: a claim that was never confirmed is not
    "waiting", it has no message anywhere. It comes back at once, the same occurrence, with no
    crash counted; the next claim is its second publish (same task id)."""
    store = make_store(publish_timeout_s=0.05)
    claimed = _claimed(store, routed=False)
    _wait_past(store, _deadline(store, claimed.job.id))
    assert store.reap() == ReapResult(unpublished=1, ids=(claimed.job.id,))
    assert store.client.hget(store.keys.counters, "unpublished") == "1"
    st = _state(store, claimed.job.id)
    assert (st.status, st.occurrence, st.crashes) == ("scheduled", claimed.occurrence, 0)
    [again] = store.claim().jobs
    assert (again.task_id, again.deliveries) == (claimed.task_id, 2)


def test_a_confirmation_for_an_older_publish_does_not_move_the_newer_claims_deadline(
        make_store: Callable[..., Store]) -> None:
    """Beat A was slow: its claim passed the publish deadline and beat B claimed again. A's
    late confirmation names publish 1; the occurrence is at publish 2, whose beat has not
    confirmed, so it stays under the publish deadline (B may still die)."""
    store = make_store(publish_timeout_s=0.05)
    first = _claimed(store, routed=False)
    _wait_past(store, _deadline(store, first.job.id))
    store.reap()
    [second] = store.claim().jobs
    deadline = _deadline(store, second.job.id)
    assert store.routed([(first, "")]) == 0
    assert _deadline(store, second.job.id) == deadline
    assert store.routed([(second, "")]) == 1


# -------------------------------------------------------------------- holds
def test_a_worker_holds_what_it_received_under_its_lease_and_its_death_republishes_it(
        make_store: Callable[..., Store]) -> None:
    """The receipt moves the deadline from the delivery deadline (hours) to one lease; while
    the worker beats it is held however long it waits; once it stops, the next reap puts the
    occurrence back at once, with no crash counted (it never ran)."""
    store = make_store(lease_s=0.3)
    claimed = _claimed(store)
    assert store.beat([], [_held(claimed)], "w1@host:1") == ([], [])
    st = _state(store, claimed.job.id)
    assert st.holder == "w1@host:1"
    assert _deadline(store, claimed.job.id) <= store.now_ms() + 300
    for _ in range(3):  # alive but slow: held past several leases, never robbed
        time.sleep(0.15)
        assert store.beat([], [_held(claimed)], "w1@host:1") == ([], [])
        assert store.reap() == ReapResult()
    _wait_past(store, _deadline(store, claimed.job.id))
    assert store.reap() == ReapResult(orphaned=1, ids=(claimed.job.id,))
    st = _state(store, claimed.job.id)
    assert (st.status, st.holder, st.crashes) == ("scheduled", None, 0)
    assert store.client.hget(store.keys.counters, "orphaned") == "1"
    [again] = store.claim().jobs
    assert (again.task_id, again.deliveries) == (claimed.task_id, 2)


def test_a_hold_is_refused_for_a_message_that_was_not_published_so(store: Store) -> None:
    """A stray copy (a publish number beyond the claims, another task name) or a message for an
    occurrence that is not queued is not held: nothing changes."""
    claimed = _claimed(store)
    job_id = claimed.job.id
    before = store_snapshot(store)
    rows = [(job_id, claimed.occurrence, 1, 2, "tests.noop"),
            (job_id, claimed.occurrence, 1, 1, "tests.other"),
            (job_id, claimed.occurrence + 1, 1, 1, "tests.noop"),
            (job_id, claimed.occurrence, 1, 0, "tests.noop")]
    for row in rows:
        assert store.beat([], [row], "w1@host:1") == ([], [job_id])
    assert _without_counters(store_snapshot(store)) == _without_counters(before)


def test_a_started_occurrence_is_no_longer_held(store: Store) -> None:
    claimed = _claimed(store)
    store.beat([], [_held(claimed)], "w1@host:1")
    started = store.start(claimed.job.id, claimed.occurrence, claimed.attempt, delivery=1,
                          task="tests.noop")
    assert started.runs
    assert _state(store, claimed.job.id).holder is None
    assert store.beat([], [_held(claimed)], "w1@host:1") == ([], [claimed.job.id])


def test_the_death_of_a_worker_holding_a_paced_message_frees_its_domains_slot(
        make_store: Callable[..., Store]) -> None:
    store = make_store(lease_s=0.2, pacing=True, domain_delay_s=0, domain_max_in_flight=1)
    claimed = _claimed(store, _job(url="http://127.9.0.1/a"))
    assert store.domain("127.9.0.1").in_flight == 1
    store.beat([], [_held(claimed)], "w1@host:1")
    _wait_past(store, _deadline(store, claimed.job.id))
    assert store.reap().orphaned == 1
    assert store.domain("127.9.0.1").in_flight == 0


# ------------------------------------------------------------------- fencing
def test_every_start_and_every_gateway_claim_numbers_its_holder_anew(
        make_store: Callable[..., Store]) -> None:
    store = make_store(lease_s=0.05)
    claimed = _claimed(store)
    first = store.start(claimed.job.id, claimed.occurrence, 1, delivery=1, task="tests.noop")
    assert first.fence == 1
    _wait_past(store, int(store.client.zscore(store.keys.leases, claimed.job.id) or 0))
    assert store.reap().redelivered == 1
    [again] = store.claim().jobs
    second = store.start(again.job.id, again.occurrence, 1, delivery=2, task="tests.noop")
    assert second.fence == 2
    http = _job("h1", transport="http")
    store.upsert(http)
    [handed] = store.claim_http(1).jobs
    assert handed.fence == 1
    assert store.settle(http.id, handed.occurrence, 1, "error", fence=1).applied
    store.run_now(http.id)
    [handed_again] = store.claim_http(1).jobs
    assert handed_again.fence == 2


def test_a_zombie_whose_lease_lapsed_can_neither_extend_retry_nor_settle_the_new_holders_run(
        make_store: Callable[..., Store]) -> None:
    """Worker A stalled past its lease; the occurrence was reaped and worker B started it.
    A's heartbeat, retry and settle (fence 1) change nothing; B's (fence 2) apply."""
    store = make_store(lease_s=0.05)
    claimed = _claimed(store)
    job_id, occ = claimed.job.id, claimed.occurrence
    a = store.start(job_id, occ, 1, delivery=1, task="tests.noop")
    _wait_past(store, int(store.client.zscore(store.keys.leases, job_id) or 0))
    assert store.reap().redelivered == 1
    # A report after the reap, before the next claim: the occurrence is scheduled.
    before = _without_counters(store_snapshot(store))
    assert store.settle(job_id, occ, 1, "complete", fence=a.fence).status == "stale"
    assert _without_counters(store_snapshot(store)) == before
    [again] = store.claim().jobs
    store.routed([(again, "")])
    b = store.start(job_id, occ, 1, delivery=2, task="tests.noop")
    assert (a.fence, b.fence) == (1, 2)
    lease = store.client.zscore(store.keys.leases, job_id)
    before = _without_counters(store_snapshot(store))
    assert store.heartbeat([(job_id, occ, 1, 1)], lease_s=3600) == [job_id]
    assert not store.retrying(job_id, occ, 1, 10.0, fence=1)
    result = store.settle(job_id, occ, 1, "error", error="zombie", fence=1)
    assert (result.applied, result.status) == (False, "stale")
    assert _without_counters(store_snapshot(store)) == before
    assert store.client.zscore(store.keys.leases, job_id) == lease
    assert store.heartbeat([(job_id, occ, 1, 2)]) == []
    assert store.settle(job_id, occ, 1, "complete", fence=b.fence).applied


def test_a_settle_for_a_message_that_never_started_applies_only_while_it_is_queued(
        store: Store) -> None:
    """Expired, revoked, rejected, skipped: the settle names its delivery, and finds the
    occurrence queued; once another copy started it, the settle is stale."""
    claimed = _claimed(store)
    job_id, occ = claimed.job.id, claimed.occurrence
    assert store.settle(job_id, occ, 1, "error", error="x", delivery=2).status == "stale"
    assert store.start(job_id, occ, 1, delivery=1, task="tests.noop").runs
    assert store.settle(job_id, occ, 1, "error", error="revoked", delivery=1).status == "stale"
    other = _claimed(store, _job("j2"))
    assert store.settle(other.job.id, other.occurrence, 1, "error", error="expired",
                        delivery=1).applied


# -------------------------------------------------------------- start checks
def test_start_refuses_a_message_for_an_occurrence_that_was_never_promoted(
        store: Store) -> None:
    """A forged or stray message naming the current occurrence of a job that is only
    scheduled (due in 2030, say) does not run and changes nothing but the refusal counter."""
    job = _job(start_at=1_893_456_000)  # 2030-01-01: scheduled, never promoted
    store.upsert(job)
    st = _state(store, job.id)
    before = store_snapshot(store)
    for delivery in (1, None):
        result = store.start(job.id, st.occurrence, 1, delivery=delivery, task="tests.noop")
        assert (result.status, result.reason, result.found) == (
            "refused", "unpromoted", "scheduled")
    assert _without_counters(store_snapshot(store)) == _without_counters(before)
    assert store.client.hget(store.keys.counters, "refused") == "2"


def test_start_refuses_a_publish_number_that_was_never_made(store: Store) -> None:
    claimed = _claimed(store)
    for delivery in (0, 2, -1):
        result = store.start(claimed.job.id, claimed.occurrence, 1, delivery=delivery,
                             task="tests.noop")
        assert (result.status, result.reason) == ("refused", "unpromoted")
    assert store.start(claimed.job.id, claimed.occurrence, 1, delivery=1, task="tests.noop").runs


def test_start_refuses_a_message_under_another_task_name(store: Store) -> None:
    """The task the occurrence was published under is the one that runs: a message naming
    another is refused, before or after beat confirmed the publish."""
    for routed in (False, True):
        claimed = _claimed(store, _job(f"j-{routed}"), routed=routed)
        before = _without_counters(store_snapshot(store))
        result = store.start(claimed.job.id, claimed.occurrence, 1, delivery=1,
                             task="tests.evil")
        assert (result.status, result.reason, result.found) == ("refused", "task", "tests.noop")
        assert _without_counters(store_snapshot(store)) == before


def test_an_edit_of_the_task_leaves_the_message_in_flight_to_run_as_published(
        store: Store) -> None:
    claimed = _claimed(store)
    store.upsert(_job(task="tests.renamed"))
    assert store.start(claimed.job.id, claimed.occurrence, 1, delivery=1, task="tests.noop").runs


# --------------------------------------------------------------- telemetry
def test_a_settle_drops_times_far_from_the_redis_clock_before_they_reach_the_stream(
        store: Store) -> None:
    claimed = _claimed(store)
    now = store.now_ms()
    event = {"task_id": "t", "due_ms": 10**30, "promoted_ms": now * 1000, "started_ms": now,
             "lateness_ms": -(10**20), "wait_ms": 5, "duration_ms": "12"}
    assert store.settle(claimed.job.id, claimed.occurrence, 1, "complete", event=event,
                        delivery=1).applied
    [(_sid, fields)] = store.events()
    data = json.loads(fields["data"])
    assert data == {"task_id": "t", "due_ms": None, "promoted_ms": None, "started_ms": now,
                    "lateness_ms": None, "wait_ms": 5, "duration_ms": None}


# ------------------------------------------------------------- one round trip
def test_a_settle_from_the_starts_definition_and_an_early_clock_never_runs_early(
        store: Store) -> None:
    """A worker settles with the definition its start returned and a clock it estimated
    (the start's plus its own monotonic time): one round trip. The script moves an
    interval's next run on by however much later it is on Redis' clock, so an estimate
    that lags never makes the next run early."""
    claimed = _claimed(store)
    started = store.start(claimed.job.id, claimed.occurrence, 1, delivery=1, task="tests.noop")
    assert started.definition == claimed.job.to_json() and started.now_ms is not None
    stale = started.now_ms - 5_000  # an estimate 5 s behind
    result = store.settle(claimed.job.id, claimed.occurrence, 1, "complete", fence=started.fence,
                          known=(started.definition, stale))
    assert result.applied and result.now_ms is not None and result.next_due_ms is not None
    assert result.next_due_ms == result.now_ms + 60_000
    st = _state(store, claimed.job.id)
    assert st.occurrence == st.next_due_ms == result.next_due_ms
    assert store.client.zscore(store.keys.schedule, claimed.job.id) == result.next_due_ms


def test_a_settle_from_a_definition_edited_since_the_start_reads_it_again(
        store: Store) -> None:
    claimed = _claimed(store)
    started = store.start(claimed.job.id, claimed.occurrence, 1, delivery=1, task="tests.noop")
    assert started.definition is not None and started.now_ms is not None
    store.upsert(_job(interval_s=3600))  # edited while it ran
    result = store.settle(claimed.job.id, claimed.occurrence, 1, "complete", fence=started.fence,
                          known=(started.definition, started.now_ms))
    assert result.applied and result.now_ms is not None
    assert result.next_due_ms == result.now_ms + 3_600_000


def test_a_settle_past_end_at_ends_the_job_even_when_the_delay_moved_it_there(
        store: Store) -> None:
    claimed = _claimed(store, _job(end_at=(store.now_ms() + 58_000) / 1000))
    started = store.start(claimed.job.id, claimed.occurrence, 1, delivery=1, task="tests.noop")
    assert started.definition is not None and started.now_ms is not None
    # Estimated 5 s early: the next run looks inside end_at, but is past it on Redis' clock.
    result = store.settle(claimed.job.id, claimed.occurrence, 1, "complete", fence=started.fence,
                          known=(started.definition, started.now_ms - 5_000))
    assert result.applied and result.status == "finished" and result.next_due_ms is None


# ----------------------------------------------------------------- rescue
def test_rescue_makes_due_only_an_unheld_occurrence_queued_for_exactly_that_publish(
        store: Store) -> None:
    """What a dead worker took from the broker without recording a hold: due again, no
    crash counted. A worker's hold, a start, or a later publish leave it alone."""
    taken = _claimed(store, _job("taken"))
    held = _claimed(store, _job("held"))
    store.beat([], [_held(held)], "w1@host:1")
    started = _claimed(store, _job("started"))
    assert store.start("started", started.occurrence, 1, delivery=1, task="tests.noop").runs
    rows = [(c.job.id, c.occurrence, c.attempt, c.deliveries) for c in (taken, held, started)]
    rows.append(("taken", taken.occurrence, 1, 2))  # a publish that was never made
    assert store.rescue(rows) == ["taken"]
    st = _state(store, "taken")
    assert (st.status, st.crashes, st.occurrence) == ("scheduled", 0, taken.occurrence)
    assert store.client.hget(store.keys.counters, "orphaned") == "1"
    [again] = store.claim().jobs
    assert (again.task_id, again.deliveries) == (taken.task_id, 2)
    # The old message's entry, swept again, names publish 1: the new claim stays.
    assert store.rescue([("taken", taken.occurrence, 1, 1)]) == []
