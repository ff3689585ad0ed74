"""Beat's sweep of the Redis broker's unacked index, against real kombu and Redis.

A consumer takes a zsched message from a Redis broker and is never heard of
again, before any heartbeat recorded its hold: the message sits in kombu's
``unacked`` hash for the visibility timeout (an hour). The sweep finds it a
lease later and makes its occurrence due again; it leaves alone entries that
are younger than a lease, messages a live worker holds, and entries that are
not zsched messages. The end-to-end proof with the default lease is the
worker crash loop (``tests/e2e/test_recovery_worker.py``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from celery import Celery

from celery_zsched.beat.publish import publish_batch
from celery_zsched.beat.unacked import UnackedSweep, occurrence_in
from celery_zsched.core.job import Job
from celery_zsched.store import Store, line_of


@pytest.fixture
def broker_app(redis_url: str) -> Iterator[Celery]:
    """A Celery app whose broker is database 7 of the throwaway server (flushed)."""
    app = Celery("unacked", broker=redis_url.rsplit("/", 1)[0] + "/7", set_as_current=False)
    app.conf.task_default_queue = "sweep"
    with app.connection_for_write() as conn:
        conn.default_channel.client.flushdb()
    yield app
    with app.connection_for_write() as conn:
        conn.default_channel.client.flushdb()
    app.close()


#: A consumer that takes every message of the queue, acknowledges none, and is killed
#: (a clean close would give them back): what a worker killed before its heartbeat leaves.
_VANISH = """
import os, signal, sys
from kombu import Connection, Queue
conn = Connection(sys.argv[1])
queue = Queue("sweep", channel=conn.channel())
while queue.get(no_ack=False) is not None:
    pass
os.kill(os.getpid(), signal.SIGKILL)
"""


def _take_and_vanish(app: Celery) -> None:
    done = subprocess.run([sys.executable, "-c", _VANISH, app.conf.broker_url], timeout=60,
                          check=False)
    assert done.returncode == -signal.SIGKILL


def test_the_sweep_brings_back_what_a_vanished_consumer_took_a_lease_ago(
        broker_app: Celery, make_store: Callable[..., Store]) -> None:
    store = make_store(lease_s=0.3)
    jobs = [Job.from_dict({"id": f"j{i}", "task": "t", "interval_s": 60, "jitter_s": 0})
            for i in range(3)]
    store.upsert_many(jobs, stagger=False)
    claimed = store.claim().jobs
    with broker_app.producer_or_acquire() as producer:
        publish_batch(broker_app, producer, claimed)
    store.routed([(c, "sweep") for c in claimed])
    held = claimed[2]
    store.beat([], [(held.job.id, held.occurrence, 1, 1, "t")], "alive@host:1")
    _take_and_vanish(broker_app)
    sweep = UnackedSweep(broker_app, store)
    try:
        assert sweep.sweep() == 0  # younger than a lease: its worker may record it yet
        time.sleep(0.35)
        store.beat([], [(held.job.id, held.occurrence, 1, 1, "t")], "alive@host:1")
        assert sweep.sweep() == 2
        assert {c.job.id for c in store.claim().jobs} == {"j0", "j1"}
        assert store.get("j2").status == "queued"  # held by a live worker: left alone
        assert sweep.sweep() == 0  # the cursor moved past them
    finally:
        sweep.close()


def test_the_sweep_switches_itself_off_on_a_broker_that_keeps_no_unacked_index(
        make_store: Callable[..., Store]) -> None:
    app = Celery("amqp", broker="amqp://guest@rabbit.invalid//", set_as_current=False)
    sweep = UnackedSweep(app, make_store())
    assert sweep.sweep() == 0
    assert not sweep.enabled and not sweep.due()


@pytest.mark.parametrize("raw", [None, b"", b"{}", b"[]", b"[1]", b'[{"headers": null}]',
                                 b'[{"headers": {"zsched_job_id": 1}}]',
                                 b'[{"headers": {"zsched_job_id": "a", "zsched_occurrence": 1.5,'
                                 b' "zsched_attempt": 1}}]',
                                 b'[{"headers": {"zsched_job_id": "a", "zsched_occurrence": true,'
                                 b' "zsched_attempt": 1}}]'])
def test_an_entry_that_is_not_a_zsched_message_is_ignored(raw: bytes | None) -> None:
    assert occurrence_in(raw) is None


def test_a_zsched_entry_names_its_occurrence_and_publish() -> None:
    raw = (b'[{"headers": {"zsched_job_id": "a", "zsched_occurrence": 5, "zsched_attempt": 2,'
           b' "zsched_delivery": 3}}, "", "q"]')
    assert occurrence_in(raw) == ("a", 5, 2, 3)


# ---------------------------------------------------------------- lost in the BRPOP window
# kombu takes a message with BRPOP and records it in the unacked index only after it read
# the reply: a worker killed in between leaves it nowhere. Here an RPOP that nobody
# records is that worker.

def _publish(app: Celery, store: Store, jobs: list[Job]) -> list[str]:
    """Claim ``jobs`` (one claim), publish and confirm them; their ids in claim order."""
    store.upsert_many(jobs, stagger=False)
    claimed = store.claim(len(jobs)).jobs
    with app.producer_or_acquire() as producer:
        publish_batch(app, producer, claimed)
    store.routed([(c, "sweep") for c in claimed])
    return [c.job.id for c in claimed]


def _pop_unrecorded(app: Celery, list_key: str = "sweep") -> str:
    """Take the oldest message of ``list_key`` as a consumer's BRPOP does, and drop it:
    its job id."""
    with app.connection_for_write() as conn:
        raw = conn.default_channel.client.rpop(list_key)
    assert raw is not None, f"{list_key!r} is empty"
    found = occurrence_in(b"[" + raw + b"]")
    assert found is not None
    return found[0]


def _job(job_id: str, **fields: object) -> Job:
    return Job.from_dict({"id": job_id, "task": "t", "interval_s": 60, "jitter_s": 0,
                          **fields})


def _queued(store: Store, *ids: str) -> list[str]:
    return [job_id for job_id in ids if store.get(job_id).status == "queued"]


def test_messages_taken_unrecorded_come_back_once_a_later_one_of_their_list_started(
        broker_app: Celery, make_store: Callable[..., Store]) -> None:
    store = make_store(lease_s=0.3)
    first = _publish(broker_app, store, [_job(f"a{i}") for i in range(3)])
    time.sleep(0.25)  # the later claim is more than the slack (a heartbeat, 0.1 s) later
    later = _publish(broker_app, store, [_job("b0")])
    lost = [_pop_unrecorded(broker_app), _pop_unrecorded(broker_app)]
    kept = _pop_unrecorded(broker_app)  # a live worker took this one, and holds it
    assert sorted([*lost, kept]) == sorted(first)
    store.beat([], [(kept, store.get(kept).state.occurrence, 1, 1, "t")], "alive@host:1")
    b0 = store.get(later[0]).state
    assert _pop_unrecorded(broker_app) == "b0"
    assert store.start("b0", b0.occurrence, 1, delivery=1, task="t").runs
    sweep = UnackedSweep(broker_app, store)
    try:
        assert sweep.sweep() == 0  # a lease has not passed: a live worker may hold them yet
        assert _queued(store, *lost) == lost
        time.sleep(0.35)
        store.beat([], [(kept, store.get(kept).state.occurrence, 1, 1, "t")], "alive@host:1")
        assert sweep.sweep() == 2
        assert sorted(c.job.id for c in store.claim().jobs) == sorted(lost)
        assert store.get(kept).status == "queued"  # held by a live worker: left alone
        assert int(store.client.hget(store.keys.counters, "orphaned") or 0) == 2
    finally:
        sweep.close()


def test_a_message_taken_unrecorded_from_a_list_now_empty_comes_back(
        broker_app: Celery, make_store: Callable[..., Store]) -> None:
    store = make_store(lease_s=0.3)
    ids = _publish(broker_app, store, [_job("c0"), _job("c1")])
    time.sleep(0.15)  # promoted more than the slack before the sweep looks
    gone = _pop_unrecorded(broker_app)
    store.beat([], [], "alive@host:1", ("sweep",))  # a live worker consumes the queue
    sweep = UnackedSweep(broker_app, store, lambda: ["sweep"])  # beat published there
    try:
        # The other message still waits in the list: nothing says the first left it
        # before a worker that lives took it.
        for _ in range(3):
            assert sweep.sweep() == 0
            time.sleep(0.15)
        assert _queued(store, *ids) == ids
        other = _pop_unrecorded(broker_app)
        assert {gone, other} == set(ids)
        store.beat([], [], "alive@host:1", ("sweep",))
        assert sweep.sweep() == 0  # the list is empty, but only a lease from now is it sure
        time.sleep(0.35)
        assert sweep.sweep() == 2
        assert _queued(store, *ids) == []
    finally:
        sweep.close()


def test_an_emptied_list_says_nothing_while_no_worker_consumes_it_nor_of_a_second_publish(
        broker_app: Celery, make_store: Callable[..., Store]) -> None:
    """The broker itself may lose a list (a flush, a failover), or a router send messages
    to a list beat does not know: an empty list proves a worker took them only while one
    consumes it, and only once per occurrence (then the delivery deadline decides)."""
    store = make_store(lease_s=0.3)
    ids = _publish(broker_app, store, [_job("d0")])
    time.sleep(0.15)
    with broker_app.connection_for_write() as conn:
        conn.default_channel.client.delete("sweep")  # lost by the broker: no worker runs
    sweep = UnackedSweep(broker_app, store, lambda: ["sweep"])
    try:
        for _ in range(4):
            assert sweep.sweep() == 0
            time.sleep(0.15)
        assert _queued(store, *ids) == ids  # it only waits, as far as anyone can tell
        # A second publish of the same occurrence (after a first rescue) is judged by
        # the starts of its list alone.
        store.client.hset(store.keys.state, "d0", json.dumps(
            {**json.loads(store.client.hget(store.keys.state, "d0")), "x": 2}))
        for _ in range(4):
            store.beat([], [], "alive@host:1", ("sweep",))
            assert sweep.sweep() == 0
            time.sleep(0.15)
        assert _queued(store, *ids) == ids
    finally:
        sweep.close()


def test_a_start_in_one_priority_list_says_nothing_of_another(
        broker_app: Celery, make_store: Callable[..., Store]) -> None:
    """kombu keeps one list per priority and serves the highest first: a message of a
    lower priority waits behind later ones of a higher priority."""
    store = make_store(lease_s=0.3)
    low = _publish(broker_app, store, [_job("low")])
    time.sleep(0.25)
    _publish(broker_app, store, [_job("high", priority=9)])
    with broker_app.connection_for_write() as conn:
        channel = conn.default_channel
        high_list = channel._q_for_pri("sweep", channel.priority(9))
    assert high_list != "sweep"
    assert _pop_unrecorded(broker_app, high_list) == "high"
    assert store.start("high", store.get("high").state.occurrence, 1, delivery=1, task="t").runs
    assert store.get("high").state.priority == 9
    sweep = UnackedSweep(broker_app, store)
    try:
        for _ in range(4):
            assert sweep.sweep() == 0
            time.sleep(0.15)
        assert _queued(store, *low) == low  # still waits in its own list
        assert _pop_unrecorded(broker_app) == "low"  # it was there all along
    finally:
        sweep.close()


def test_a_fleets_held_prefetch_does_not_hide_a_lost_message_from_the_look(
        broker_app: Celery, make_store: Callable[..., Store]) -> None:
    """Held messages sort first in ``queued`` (a lease from their last heartbeat): the
    look skips them, so a bounded look still reaches the lost one behind them."""
    store = make_store(lease_s=0.3)
    taken = _publish(broker_app, store, [_job(f"h{i}") for i in range(4)])
    time.sleep(0.05)
    _publish(broker_app, store, [_job("later")])
    popped = [_pop_unrecorded(broker_app) for _ in range(4)]
    assert sorted(popped) == sorted(taken)
    held, lost = popped[:3], popped[3]
    store.beat([], [(job_id, store.get(job_id).state.occurrence, 1, 1, "t") for job_id in held],
               "alive@host:1")
    assert _pop_unrecorded(broker_app) == "later"
    assert store.start("later", store.get("later").state.occurrence, 1, delivery=1,
                       task="t").runs
    marks = store.received_marks()
    assert list(marks) == [line_of("sweep")]
    assert store.rescue_lost(marks, slack_ms=0, limit=1) == [lost]
    assert _queued(store, *held) == held


def test_a_republished_message_runs_first_and_its_start_takes_nothing_behind_it_for_lost(
        broker_app: Celery, make_store: Callable[..., Store]) -> None:
    """A lost message made due again is pushed to the front of its list, ahead of a first
    delivery that waited there all along. Its start proves nothing about the messages
    behind it, so it marks no line: the waiting one is not taken for lost."""
    store = make_store(lease_s=0.3)
    lost = _publish(broker_app, store, [_job("lost")])[0]
    time.sleep(0.05)
    waiting = _publish(broker_app, store, [_job("waiting")])[0]
    assert _pop_unrecorded(broker_app) == lost
    line = line_of("sweep")
    # A later first delivery's start would give this mark: the lost one only.
    promoted = store.get(waiting).state.promoted_ms
    assert promoted is not None
    assert store.rescue_lost({line: promoted}, slack_ms=1, limit=10) == [lost]
    claimed = store.claim().jobs
    assert [(c.job.id, c.deliveries) for c in claimed] == [(lost, 2)]
    with broker_app.producer_or_acquire() as producer:
        publish_batch(broker_app, producer, claimed)
    store.routed([(c, "sweep") for c in claimed])
    assert _pop_unrecorded(broker_app) == lost  # the front: ahead of the waiting one
    assert store.start(lost, claimed[0].occurrence, 1, delivery=2, task="t").runs
    assert store.received_marks() == {}
    assert store.rescue_lost(store.received_marks(), slack_ms=0, limit=10) == []
    assert _queued(store, waiting) == [waiting]
    assert _pop_unrecorded(broker_app) == waiting  # still there, once


def test_an_original_that_shows_up_after_its_republish_marks_no_line(
        broker_app: Celery, make_store: Callable[..., Store]) -> None:
    """An occurrence taken for lost and republished whose first message shows up after
    all (a slow worker, kombu's restore): that message was pushed at the first publish,
    before the promotion time the state now holds, so its start marks nothing and the
    message published between the two is not taken for lost."""
    store = make_store()
    first = _publish(broker_app, store, [_job("first")])[0]
    time.sleep(0.05)
    between = _publish(broker_app, store, [_job("between")])[0]
    promoted = store.get(between).state.promoted_ms
    assert promoted is not None
    assert store.rescue_lost({line_of("sweep"): promoted}, slack_ms=1, limit=10) == [first]
    time.sleep(0.05)
    claimed = store.claim().jobs
    assert [(c.job.id, c.deliveries) for c in claimed] == [(first, 2)]
    store.routed([(c, "sweep") for c in claimed])
    assert store.start(first, claimed[0].occurrence, 1, delivery=1, task="t").runs
    assert store.received_marks() == {}
    assert store.rescue_lost(store.received_marks(), slack_ms=0, limit=10) == []
    assert _queued(store, between) == [between]
