"""A settle sent ahead of its reply (``Store.settle_soon``) against a real Redis.

The worker sends a completed task's settle and reads its reply at its next
start: Redis must apply it as it arrives, replies must reach their callers in
order, and a reply that cannot be had must be handed over as ``None`` (the
caller then settles the usual way) without leaving a connection with an unread
reply in the pool.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, signals

from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.core.job import Job
from celery_zsched.core.results import SettleResult
from celery_zsched.core.state import RuntimeState
from celery_zsched.services.appstore import forget_app, store_for_app
from celery_zsched.store import Store, scripts
from celery_zsched.worker import settle as worker_settle
from celery_zsched.worker.headers import Occurrence


@pytest.fixture(autouse=True)
def _settle_loaded(store: Store) -> None:
    """The server knows settle.lua, as it does once any worker settled (see the NOSCRIPT test)."""
    store.client.script_load(scripts.source("settle"))


def _queued(store: Store, job_id: str) -> tuple[int, int]:
    """A job stored, claimed and published, not started: (occurrence, delivery)."""
    store.upsert(Job.from_dict({"id": job_id, "task": "tests.noop", "interval_s": 60,
                                "jitter_s": 0}))
    claimed = next(c for c in store.claim().jobs if c.job.id == job_id)
    store.routed([(claimed, "")])
    return claimed.occurrence, claimed.deliveries


def _started(store: Store, job_id: str) -> tuple[int, int, tuple[str, int]]:
    """A job stored, claimed, published and started: (occurrence, fence, known)."""
    occurrence, delivery = _queued(store, job_id)
    start = store.start(job_id, occurrence, 1, delivery=delivery, task="tests.noop")
    assert start.status == "ok" and start.fence is not None
    assert start.definition is not None and start.now_ms is not None
    return occurrence, start.fence, (start.definition, start.now_ms)


def _status(store: Store, job_id: str) -> str:
    return RuntimeState.from_wire(store.client.hget(store.keys.state, job_id)).status


def _in_use(store: Store) -> int:
    return len(store.client.connection_pool._in_use_connections)


def test_a_settle_sent_ahead_is_applied_before_its_reply_is_read(store: Store) -> None:
    results: list[SettleResult | None] = []
    jobs = ["a1", "a2", "a3"]
    # All started first: a start behind a settle sent ahead would read its reply.
    started = [_started(store, job_id) for job_id in jobs]
    for job_id, (occurrence, fence, known) in zip(jobs, started, strict=True):
        store.settle_soon(job_id, occurrence, 1, "complete", results.append, known=known,
                          event={"duration_ms": 3}, fence=fence)
    assert results == []  # nothing read yet ...
    # ... but Redis applies each as it arrives (seen from another connection)
    for _ in range(500):
        if [_status(store, job_id) for job_id in jobs] == ["scheduled"] * 3:
            break
        time.sleep(0.01)
    assert [_status(store, job_id) for job_id in jobs] == ["scheduled"] * 3
    assert results == []
    assert _in_use(store) == 1  # the lane keeps its connection while replies are unread
    assert store.collect() == 3
    assert [(r.applied, r.status, r.job.id if r.job else None) for r in results if r] == [
        (True, "scheduled", job_id) for job_id in jobs]
    assert _in_use(store) == 0 and store.collect() == 0


def test_a_settle_sent_ahead_by_a_lapsed_holder_changes_nothing(store: Store) -> None:
    occurrence, fence, known = _started(store, "z")
    results: list[SettleResult | None] = []
    store.settle_soon("z", occurrence, 1, "complete", results.append, known=known,
                      fence=fence + 1)
    store.collect()
    assert [(r.applied, r.status) for r in results if r] == [(False, "stale")]
    assert _status(store, "z") == "running"


def test_a_definition_edited_meanwhile_hands_over_none_and_changes_nothing(store: Store) -> None:
    occurrence, fence, known = _started(store, "e")
    store.upsert(Job.from_dict({"id": "e", "task": "tests.noop", "interval_s": 120,
                                "jitter_s": 0}))
    results: list[SettleResult | None] = []
    store.settle_soon("e", occurrence, 1, "complete", results.append, known=known, fence=fence)
    store.collect()
    assert results == [None] and _status(store, "e") == "running"
    # The caller settles the usual way: the new interval applies.
    again = store.settle("e", occurrence, 1, "complete", fence=fence)
    assert again.applied and again.next_due_ms is not None and again.now_ms is not None
    assert again.next_due_ms - again.now_ms >= 119_000


def test_replies_lost_with_the_connection_are_handed_over_as_none(store: Store) -> None:
    results: list[Any] = []
    started = [_started(store, job_id) for job_id in ("l1", "l2")]
    for job_id, (occurrence, fence, known) in zip(("l1", "l2"), started, strict=True):
        store.settle_soon(job_id, occurrence, 1, "complete", results.append, known=known,
                          fence=fence)
    assert store.lane is not None and store.lane.pending == 2
    store.lane._conn.disconnect()  # the connection breaks before the replies are read
    store.collect()
    assert results == [None, None] and _in_use(store) == 0
    # The connection went back to the pool closed: the next caller reconnects.
    assert store.now_ms() > 0



def test_replies_lost_with_a_failed_send_are_handed_over_as_none_not_read_off_the_next_connection(
        store: Store) -> None:
    """A send that fails (the socket broke) takes the earlier unread replies with it:
    they are handed over as ``None`` at the next read, which reads off the new
    connection only the replies of the calls sent on it."""
    results: list[tuple[str, Any]] = []
    started = {job_id: _started(store, job_id) for job_id in ("f1", "f2")}

    def settle_soon(job_id: str) -> None:
        occurrence, fence, known = started[job_id]
        store.settle_soon(job_id, occurrence, 1, "complete",
                          lambda result: results.append((job_id, result)), known=known,
                          fence=fence)
    settle_soon("f1")
    assert store.lane is not None and store.lane._conn is not None
    store.lane._conn._sock.shutdown(socket.SHUT_RDWR)
    with pytest.raises(StoreUnavailable):
        settle_soon("f2")
    assert store.lane.pending == 1  # f1's reply, lost with the connection
    settle_soon("f2")  # on a new connection
    assert store.collect() == 2
    assert [(job_id, r if r is None else (r.applied, r.job.id if r.job else None))
            for job_id, r in results] == [("f1", None), ("f2", (True, "f2"))]
    assert _in_use(store) == 0 and store.lane.pending == 0


def _settled_ahead(store: Store, job_id: str, results: list[Any]) -> None:
    occurrence, fence, known = _started(store, job_id)
    store.settle_soon(job_id, occurrence, 1, "complete", results.append, known=known,
                      fence=fence)


def test_a_start_behind_a_settle_sent_ahead_reads_both_replies_on_its_connection(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    results: list[SettleResult | None] = []
    _settled_ahead(store, "b1", results)
    occurrence, delivery = _queued(store, "b2")
    assert store.lane is not None and store.lane.pending == 1 and _in_use(store) == 1

    def no_second_connection(*_: Any, **__: Any) -> Any:
        raise AssertionError("the start checked out a connection of its own")
    monkeypatch.setattr(store, "_call_hot", no_second_connection)
    start = store.start("b2", occurrence, 1, delivery=delivery, task="tests.noop")
    assert start.status == "ok" and start.fence is not None
    # The settle's reply was handed over on the way, and the connection given back.
    assert [(r.applied, r.job.id if r.job else None) for r in results if r] == [(True, "b1")]
    assert store.lane.pending == 0 and _in_use(store) == 0
    assert (_status(store, "b1"), _status(store, "b2")) == ("scheduled", "running")


def test_a_start_finds_the_lane_busy_in_another_thread_and_goes_the_usual_way(
        store: Store) -> None:
    results: list[SettleResult | None] = []
    _settled_ahead(store, "c1", results)
    occurrence, delivery = _queued(store, "c2")
    assert store.lane is not None
    with store.lane._lock:  # another thread of the process is on the lane
        start = store.start("c2", occurrence, 1, delivery=delivery, task="tests.noop")
    assert start.status == "ok"
    assert results == [] and store.lane.pending == 1  # left for its reader
    assert store.collect() == 1 and [r.applied for r in results if r] == [True]


def test_a_start_on_the_lane_that_the_server_does_not_know_is_made_the_usual_way(
        store: Store) -> None:
    results: list[SettleResult | None] = []
    _settled_ahead(store, "d1", results)
    for _ in range(500):  # applied as it arrived, before the scripts are flushed
        if _status(store, "d1") == "scheduled":
            break
        time.sleep(0.01)
    occurrence, delivery = _queued(store, "d2")
    store.client.script_flush()
    start = store.start("d2", occurrence, 1, delivery=delivery, task="tests.noop")
    assert start.status == "ok" and _status(store, "d2") == "running"
    assert [r.applied for r in results if r] == [True] and len(results) == 1


def test_a_pool_process_lane_keeps_its_connection_and_reconnects_when_it_breaks(
        store: Store) -> None:
    assert store.lane is not None
    store.lane.keep = True
    results: list[SettleResult | None] = []
    _settled_ahead(store, "k1", results)
    occurrence, delivery = _queued(store, "k2")
    conn = store.lane._conn
    assert store.start("k2", occurrence, 1, delivery=delivery, task="tests.noop").status == "ok"
    # Every reply read, and the connection kept for the next execution: one checkout.
    assert store.lane.pending == 0 and store.lane._conn is conn and _in_use(store) == 1
    assert [r.applied for r in results if r] == [True]
    broken = conn._sock
    broken.shutdown(socket.SHUT_RDWR)  # the kept connection breaks (Redis restarted)
    # k3's start finds it broken and goes the usual way; its settle reconnects the lane.
    _settled_ahead(store, "k3", results)
    conn = store.lane._conn
    assert conn is not None and conn._sock is not None and conn._sock is not broken
    occurrence, fence, known = _started(store, "k4")
    conn._sock.shutdown(socket.SHUT_RDWR)  # and breaks again, with nothing pending
    with pytest.raises(StoreUnavailable):  # k4's settle: the caller settles the usual way
        store.settle_soon("k4", occurrence, 1, "complete", results.append, known=known,
                          fence=fence)
    _settled_ahead(store, "k5", results)  # on a new connection, kept in turn
    assert store.collect() == 1  # k5's: k4's start took k3's reply on its way
    assert [r.job.id if r and r.job else None for r in results] == ["k1", "k3", "k5"]
    assert [_status(store, job_id) for job_id in ("k3", "k4", "k5")] == [
        "scheduled", "running", "scheduled"]
    assert _in_use(store) == 1


def test_a_server_that_never_ran_settle_hands_over_none_and_changes_nothing(
        store: Store) -> None:
    occurrence, fence, known = _started(store, "n")
    store.client.script_flush()
    results: list[SettleResult | None] = []
    store.settle_soon("n", occurrence, 1, "complete", results.append, known=known, fence=fence)
    store.collect()
    assert results == [None] and _status(store, "n") == "running"
    assert store.settle("n", occurrence, 1, "complete", fence=fence).applied  # loads it


def test_a_worker_process_settles_a_completed_task_ahead_and_logs_it_when_read(
        redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """In a worker process (``send_ahead``), ``settle_occurrence`` of a completed task
    returns before its reply is read; the process's next start reads it (and logs)."""
    app = Celery("ahead", set_as_current=False)
    app.conf.zsched_redis_url = redis_url
    app.conf.zsched_key_prefix = "{a" + uuid.uuid4().hex[:8] + "}:"
    monkeypatch.setattr(worker_settle._AHEAD, "on", True)
    try:
        store = store_for_app(app)
        store.client.script_load(scripts.source("settle"))
        occurrence, fence, known = _started(store, "w")
        request = SimpleNamespace(
            zsched_start=SimpleNamespace(fence=fence, due_ms=occurrence, promoted_ms=occurrence,
                                         definition=known[0], now_ms=known[1]),
            zsched_started_ms=known[1], zsched_started_mono=time.monotonic())
        occ = Occurrence("w", occurrence, 1, occurrence, occurrence, None, 1)
        with caplog.at_level("INFO", logger="celery_zsched"):
            worker_settle.settle_occurrence(app, occ, "complete", request, task_id="t-1")
            assert store.lane is not None and store.lane.pending == 1
            assert "job_complete" not in caplog.text
            worker_settle.collect_sent(app)  # what the next start does
        assert store.lane.pending == 0
        assert _status(store, "w") == "scheduled"
        assert '"applied":true' in caplog.text and "job_complete" in caplog.text
    finally:
        forget_app(app)


def test_a_prefork_pool_process_keeps_its_lane_connection_and_the_main_process_does_not(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import celery_zsched.worker as worker

    app = Celery("keep", set_as_current=False)
    app.conf.zsched_redis_url = redis_url
    app.conf.zsched_key_prefix = "{k" + uuid.uuid4().hex[:8] + "}:"
    try:
        lane = store_for_app(app).lane
        assert lane is not None and not lane.keep  # the main process gives it back
        monkeypatch.setattr(worker, "current_app", app)
        signals.worker_process_init.send(sender="host")  # what a prefork child hears
        assert lane.keep
    finally:
        forget_app(app)


def test_a_forked_child_starts_with_an_empty_lane_and_a_free_lock_without_touching_the_parents(
        store: Store) -> None:
    """A pool process is forked from a main process whose lane may have replies unread
    and whose lock another thread may hold at that instant: the child reads none of
    the parent's replies off the shared socket, and does not deadlock on the lock."""
    lane = store.lane
    assert lane is not None
    occurrence, fence, known = _started(store, "f1")
    results: list[SettleResult | None] = []
    store.settle_soon("f1", occurrence, 1, "complete", results.append, known=known, fence=fence)
    assert lane.pending == 1
    held, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        with lane._lock:
            held.set()
            release.wait(30)
    holder = threading.Thread(target=hold_lock)
    holder.start()
    assert held.wait(30)
    pid = os.fork()
    if pid == 0:  # the child: report by exit status only
        code = 1
        try:
            if lane.pending == 0 and lane._lock.acquire(timeout=5):
                lane._lock.release()
                occ2, fence2, known2 = _started(store, "f2")
                got: list[SettleResult | None] = []
                store.settle_soon("f2", occ2, 1, "complete", got.append, known=known2,
                                  fence=fence2)
                store.collect()
                code = 0 if len(got) == 1 and got[0] is not None and got[0].applied else 2
        finally:
            os._exit(code)
    release.set()
    holder.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.collect() == 1  # the parent's reply was left for the parent
    assert results and results[0] is not None and results[0].applied


def test_a_kept_lane_takes_a_start_with_no_settle_ahead_of_it_on_its_own_connection(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefork pool process's first task, or one after the collector's timer read the
    last reply: its start goes on the kept connection too, not a second one."""
    assert store.lane is not None
    store.lane.keep = True
    results: list[SettleResult | None] = []
    _settled_ahead(store, "e1", results)
    assert store.collect() == 1 and store.lane.pending == 0  # what the timer does
    conn = store.lane._conn
    occurrence, delivery = _queued(store, "e2")

    def no_second_connection(*_: Any, **__: Any) -> Any:
        raise AssertionError("the start checked out a connection of its own")
    monkeypatch.setattr(store, "_call_hot", no_second_connection)
    assert store.start("e2", occurrence, 1, delivery=delivery, task="tests.noop").status == "ok"
    assert store.lane._conn is conn and _in_use(store) == 1 and _status(store, "e2") == "running"
