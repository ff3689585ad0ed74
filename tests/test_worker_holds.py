"""A message Celery acknowledges as a pool process accepts it is held in Redis first.

Without ``acks_late`` (Celery's default) the worker's main process acknowledges
a task message the moment a pool process accepts it, before that process runs
the start compare-and-set. A worker tree killed in between leaves a message no
broker gives back and an occurrence that is not running: only a hold tells the
reaper about it. Here a real Celery ``Request`` of a real message taken from a
Redis broker is accepted, and Redis is read at the instant of the
acknowledgement. The end-to-end proof (a prefork tree SIGKILLed in that window,
every default, Redis and RabbitMQ brokers) is in
``tests/e2e/test_recovery_worker.py``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from celery import Celery
from celery.utils.imports import symbol_by_name
from celery.worker.request import Request
from kombu import Queue
from kombu.asynchronous import Hub
from kombu.message import Message

from celery_zsched.beat.publish import publish_batch
from celery_zsched.core.job import Job
from celery_zsched.core.state import RuntimeState
from celery_zsched.services.appstore import forget_app, store_for_app
from celery_zsched.store import Store
from celery_zsched.worker import heartbeat
from celery_zsched.worker.headers import Occurrence, occurrence_of
from celery_zsched.worker.start import install_start

QUEUE = "holds"


def _noop() -> None:
    """The body of every task here: only their acceptance is looked at."""
HOSTNAME = "w1@host"


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    """A Celery app on database 6 of the throwaway server (its broker, flushed) whose
    store is database 0 under a key prefix of its own, with the start installed."""
    app = Celery("holds", broker=redis_url.rsplit("/", 1)[0] + "/6", set_as_current=False)
    app.conf.task_default_queue = QUEUE
    app.conf.zsched_redis_url = redis_url
    app.conf.zsched_key_prefix = "{h" + uuid.uuid4().hex[:8] + "}:"
    app.task(name="t")(_noop)
    install_start(app)
    with app.connection_for_write() as conn:
        conn.default_channel.client.flushdb()
    yield app
    with app.connection_for_write() as conn:
        conn.default_channel.client.flushdb()
    heartbeat._beats.pop(id(app), None)
    forget_app(app)
    app.close()


def _state(store: Store, job_id: str) -> RuntimeState:
    return RuntimeState.from_wire(store.client.hget(store.keys.state, job_id))


@pytest.fixture
def taken(app: Celery) -> Iterator[Callable[[], tuple[Store, Occurrence, Message]]]:
    """``taken()``: a job published by beat's code and taken from the broker,
    unacknowledged (its store, occurrence and message)."""
    conns: list[Any] = []

    def take() -> tuple[Store, Occurrence, Message]:
        conns.append(app.connection_for_read())
        return _taken(app, conns[-1])
    yield take
    for conn in conns:
        conn.close()


def _published(app: Celery, ids: list[str]) -> Store:
    """Jobs ``ids`` stored, claimed and published by beat's code; their store."""
    store = store_for_app(app)
    store.upsert_many([Job.from_dict({"id": job_id, "task": "t", "interval_s": 60,
                                      "jitter_s": 0}) for job_id in ids], stagger=False)
    claimed = store.claim().jobs
    with app.producer_or_acquire() as producer:
        publish_batch(app, producer, claimed)
    store.routed([(c, QUEUE) for c in claimed])
    return store


def _taken(app: Celery, conn: Any) -> tuple[Store, Occurrence, Message]:
    store = _published(app, ["j"])
    message = Queue(QUEUE, channel=conn.channel()).get(no_ack=False)
    assert message is not None
    occ = occurrence_of(message.headers)
    assert occ is not None
    return store, occ, message


def _request(app: Celery, message: Message, on_ack: Callable[..., None]) -> Request:
    """The worker's request of ``message``, as the task's strategy builds it."""
    task = app.tasks[message.headers["task"]]
    cls: type[Request] = symbol_by_name(task.Request)
    return cls(message, on_ack=on_ack, app=app, task=task, hostname=HOSTNAME,
               body=message.body, headers=message.headers, decoded=False, utc=True)


def test_an_early_acknowledgement_waits_until_redis_holds_the_message(
        app: Celery, taken: Callable[[], tuple[Store, Occurrence, Message]]) -> None:
    store, occ, message = taken()
    job_id = occ.job_id
    seen: dict[str, Any] = {}

    def on_ack(*args: Any) -> None:
        st = _state(store, job_id)
        seen.update(holder=st.holder, status=st.status,
                    deadline=store.client.zscore(store.keys.queued, job_id),
                    now=store.now_ms())
        message.ack()

    assert _state(store, job_id).holder is None  # received only: no hold recorded yet
    _request(app, message, on_ack).on_accepted(os.getpid(), 0.0)

    assert seen["status"] == "queued"
    assert seen["holder"] == f"{HOSTNAME}:{os.getpid()}"
    lease_ms = store.settings.lease_s * 1000
    assert seen["now"] - 1000 < seen["deadline"] - lease_ms <= seen["now"]
    assert message.acknowledged


def test_a_late_acknowledgement_holds_nothing_at_acceptance(
        app: Celery, taken: Callable[[], tuple[Store, Occurrence, Message]]) -> None:
    app.tasks["t"].acks_late = True
    store, occ, message = taken()
    job_id = occ.job_id
    acked: list[bool] = []
    _request(app, message, lambda *args: acked.append(True)).on_accepted(os.getpid(), 0.0)
    assert not acked  # acknowledged after the run: the broker keeps it until then
    assert _state(store, job_id).holder is None


def test_a_hold_a_heartbeat_recorded_costs_no_second_round_trip(
        app: Celery, taken: Callable[[], tuple[Store, Occurrence, Message]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    store, occ, message = taken()
    job_id = occ.job_id
    request = _request(app, message, lambda *args: message.ack())
    beat = heartbeat.heartbeat_for(app, store)
    beat.hold(request, (job_id, occ.occurrence, 1, 1, "t"), f"{HOSTNAME}:{os.getpid()}")
    beat.beat()
    assert _state(store, occ.job_id).holder == f"{HOSTNAME}:{os.getpid()}"
    holds: list[Any] = []
    real_hold = store.hold
    monkeypatch.setattr(store, "hold", lambda *args: holds.append(args) or real_hold(*args))
    request.on_accepted(os.getpid(), 0.0)
    assert holds == [] and message.acknowledged


def test_a_hold_of_an_occurrence_that_started_already_is_dropped(
        app: Celery, taken: Callable[[], tuple[Store, Occurrence, Message]]) -> None:
    """The pool process may run the start before the main process hears it accepted."""
    store, occ, message = taken()
    job_id = occ.job_id
    assert store.start(job_id, occ.occurrence, 1, delivery=1, task="t").status == "ok"
    request = _request(app, message, lambda *args: message.ack())
    request.on_accepted(os.getpid(), 0.0)
    beat = heartbeat.heartbeat_for(app, store)
    assert beat.held() == []  # nothing left for the heartbeat to keep alive
    st = _state(store, job_id)
    assert (st.status, st.holder) == ("running", None)


def test_a_tasks_own_request_class_is_kept_under_the_hold(
        app: Celery, taken: Callable[[], tuple[Store, Occurrence, Message]]) -> None:
    accepted: list[int] = []

    class Audited(Request):
        def on_accepted(self, pid: Any, time_accepted: float) -> None:
            accepted.append(pid)
            super().on_accepted(pid, time_accepted)

    task = app.task(name="audited", Request=Audited)(_noop)
    install_start(app)
    cls = task.Request
    assert issubclass(cls, Audited) and cls.zsched_holds
    install_start(app)
    assert task.Request is cls  # installing twice does not wrap twice
    assert issubclass(symbol_by_name(app.tasks["t"].Request), Request)
    store, occ, message = taken()
    request = cls(message, on_ack=lambda *args: message.ack(), app=app, task=task,
                  hostname=HOSTNAME, body=message.body, headers=message.headers,
                  decoded=False, utc=True)
    request.on_accepted(1234, 0.0)
    assert accepted == [1234] and message.acknowledged
    assert _state(store, occ.job_id).holder == f"{HOSTNAME}:{os.getpid()}"


def _received(app: Celery, conn: Any, ids: list[str],
              on_ack: Callable[[Message, str], None] | None = None
              ) -> list[tuple[Request, Occurrence]]:
    """``ids``' messages taken from the broker, unacknowledged, as the worker's requests
    (each acknowledged by ``on_ack(message, job_id)``, else by its ``ack``)."""
    queue = Queue(QUEUE, channel=conn.channel())
    out = []
    for _ in ids:
        message = queue.get(no_ack=False)
        assert message is not None
        occ = occurrence_of(message.headers)
        assert occ is not None

        def ack(*_: Any, message: Message = message, job_id: str = occ.job_id) -> None:
            if on_ack is None:
                message.ack()
            else:
                on_ack(message, job_id)
        out.append((_request(app, message, ack), occ))
    return out


@pytest.mark.parametrize("on_receipt", [False, True], ids=["batched", "sent-on-receipt"])
def test_the_prefetch_is_held_before_each_acknowledgement_without_a_round_trip_each(
        app: Celery, monkeypatch: pytest.MonkeyPatch, on_receipt: bool) -> None:
    """The main process accepts its prefetch one message after another. Each message
    is held in Redis when it is acknowledged, yet: either its hold went out when it
    was received (its reply read at the acceptance, no round trip waited for), or
    the first acceptance records every message received so far in one round trip."""
    ids = [f"p{i}" for i in range(5)]
    store = _published(app, ids)
    beat = heartbeat.heartbeat_for(app, store)
    holder = f"{HOSTNAME}:{os.getpid()}"
    holds: list[Any] = []
    real_hold = store.hold
    monkeypatch.setattr(store, "hold", lambda *args: holds.append(args) or real_hold(*args))
    seen: dict[str, str | None] = {}

    def on_ack(message: Message, job_id: str) -> None:
        seen[job_id] = _state(store, job_id).holder
        message.ack()
    with app.connection_for_read() as conn:
        received = _received(app, conn, ids, on_ack)
        for request, occ in received:
            beat.hold(request, (occ.job_id, occ.occurrence, 1, 1, "t"), holder,
                      record=on_receipt)
        for request, _ in received:
            request.on_accepted(os.getpid(), 0.0)
    assert seen == {job_id: holder for job_id in ids}
    if on_receipt:
        assert holds == [] and store.lane is not None and store.lane.pending == 0
    else:
        assert len(holds) == 1 and len(holds[0][0]) == len(ids)


@dataclass
class Receipts:
    """Jobs published, their messages taken, and the hold calls sent on the lane."""

    store: Store
    beat: heartbeat.Heartbeat
    hub: Hub
    #: The rows of each hold call sent on the store's lane, as they are sent.
    sent: list[int]
    received: list[tuple[Request, Occurrence]]

    def hold(self, first: int = 0, last: int | None = None) -> None:
        """The main process receives messages ``first`` to ``last``, on the hub's timer."""
        for request, occ in self.received[first:last]:
            self.beat.hold(request, (occ.job_id, occ.occurrence, 1, 1, "t"), HOLDER,
                           record=True, later=self.hub.call_later)

    def holders(self) -> list[str | None]:
        return [_state(self.store, occ.job_id).holder for _, occ in self.received]


HOLDER = f"{HOSTNAME}:{os.getpid()}"


@pytest.fixture
def receipts(app: Celery, monkeypatch: pytest.MonkeyPatch
             ) -> Iterator[Callable[[str, int], Receipts]]:
    """``receipts(prefix, n)``: n jobs published and their messages taken, unacknowledged,
    with a kombu Hub for the holds' timer."""
    hubs: list[Hub] = []
    conns: list[Any] = []

    def make(prefix: str, n: int) -> Receipts:
        ids = [f"{prefix}{i}" for i in range(n)]
        store = _published(app, ids)
        lane = store.lane
        assert lane is not None
        sent: list[int] = []
        real_send = lane.send

        def send(script: Any, keys: Any, args: Any, on_reply: Any) -> None:
            sent.append((len(args) - 3) // 6)  # three arguments, then six per row
            real_send(script, keys, args, on_reply)
        monkeypatch.setattr(lane, "send", send)
        hubs.append(Hub())
        conns.append(app.connection_for_read())
        return Receipts(store, heartbeat.heartbeat_for(app, store), hubs[-1], sent,
                        _received(app, conns[-1], ids))
    yield make
    for conn in conns:
        conn.close()
    for hub in hubs:
        hub.close()


def test_holds_received_together_go_out_in_one_script_call_on_the_event_loops_timer(
        receipts: Callable[[str, int], Receipts], monkeypatch: pytest.MonkeyPatch) -> None:
    """A Redis broker's receipts come a fraction of a millisecond apart while the pool
    is behind: their holds wait up to HOLD_SOON_S for one another on the worker's own
    event loop (a kombu Hub), and one script call records them all."""
    r = receipts("s", 5)
    r.hold()
    assert r.sent == []  # waiting for the timer, one entry for the five
    assert len(r.hub.timer.queue) == 1
    assert r.holders() == [None] * 5
    for _ in range(1000):  # the entry is due HOLD_SOON_S after the first receipt
        r.hub.fire_timers(propagate=(Exception,))
        if r.sent:
            break
        time.sleep(0.001)
    assert r.sent == [5]
    assert r.store.collect() == 1
    assert r.holders() == [HOLDER] * 5
    holds: list[Any] = []
    real_hold = r.store.hold
    monkeypatch.setattr(r.store, "hold", lambda *args: holds.append(args) or real_hold(*args))
    for request, _ in r.received:
        request.on_accepted(os.getpid(), 0.0)
    assert holds == [] and r.sent == [5]  # every acceptance found its hold recorded
    assert all(request.acknowledged for request, _ in r.received)


def test_an_acceptance_sends_the_holds_that_wait_at_once_and_the_timer_then_sends_nothing(
        receipts: Callable[[str, int], Receipts], monkeypatch: pytest.MonkeyPatch) -> None:
    r = receipts("t", 3)
    r.hold()
    request, occ = r.received[1]
    seen: dict[str, str | None] = {}
    real_ack = request.acknowledge

    def acknowledge() -> None:
        seen[occ.job_id] = _state(r.store, occ.job_id).holder
        real_ack()
    monkeypatch.setattr(request, "acknowledge", acknowledge)
    request.on_accepted(os.getpid(), 0.0)
    assert seen == {occ.job_id: HOLDER}  # held in Redis before the acknowledgement
    assert r.sent == [3]  # the three that waited, in one call
    assert r.holders() == [HOLDER] * 3
    time.sleep(heartbeat.HOLD_SOON_S * 2)
    r.hub.fire_timers(propagate=(Exception,))
    assert r.sent == [3]


def test_holds_that_wait_go_out_once_they_fill_a_batch(
        receipts: Callable[[str, int], Receipts], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heartbeat, "HOLD_SOON_BATCH", 2)
    r = receipts("u", 5)
    r.hold()
    assert r.sent == [2, 2]  # the fifth waits for the timer
    r.beat.send_holds()
    assert r.sent == [2, 2, 1]
    assert r.store.collect() == 3


def test_an_acceptance_whose_hold_went_out_leaves_the_later_holds_waiting_for_their_batch(
        receipts: Callable[[str, int], Receipts]) -> None:
    """The pool accepts its prefetch in order: the message accepted now was received
    long before, its hold sent. The holds of the messages received since keep waiting
    for one another; only an acceptance of one of them sends them early."""
    r = receipts("v", 4)
    r.hold(0, 2)
    r.beat.send_holds()  # what the timer does
    r.hold(2)
    first, last = r.received[0][0], r.received[3][0]
    first.on_accepted(os.getpid(), 0.0)
    assert first.acknowledged and r.holders()[0] == HOLDER
    assert r.sent == [2]  # the two received after it still wait
    last.on_accepted(os.getpid(), 0.0)
    assert r.sent == [2, 2] and r.holders()[3] == HOLDER
