"""A settle sent ahead of its reply (``Store.settle_soon``) against a real Redis.

The worker sends a completed task's settle and reads its reply at its next
start: Redis must apply it as it arrives, replies must reach their callers in
order, and a reply that cannot be had must be handed over as ``None`` (the
caller then settles the usual way) without leaving a connection with an unread
reply in the pool.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

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


def _started(store: Store, job_id: str) -> tuple[int, int, tuple[str, int]]:
    """A job stored, claimed, published and started: (occurrence, fence, known)."""
    store.upsert(Job.from_dict({"id": job_id, "task": "tests.noop", "interval_s": 60,
                                "jitter_s": 0}))
    claimed = next(c for c in store.claim().jobs if c.job.id == job_id)
    store.routed([(claimed, "")])
    start = store.start(job_id, claimed.occurrence, 1, delivery=claimed.deliveries,
                        task="tests.noop")
    assert start.status == "ok" and start.fence is not None
    assert start.definition is not None and start.now_ms is not None
    return claimed.occurrence, start.fence, (start.definition, start.now_ms)


def _status(store: Store, job_id: str) -> str:
    return RuntimeState.from_wire(store.client.hget(store.keys.state, job_id)).status


def _in_use(store: Store) -> int:
    return len(store.client.connection_pool._in_use_connections)


def test_a_settle_sent_ahead_is_applied_before_its_reply_is_read(store: Store) -> None:
    results: list[SettleResult | None] = []
    jobs = ["a1", "a2", "a3"]
    started = {job_id: _started(store, job_id) for job_id in jobs}
    for job_id, (occurrence, fence, known) in started.items():
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
    assert _in_use(store) == 1  # the lane's connection, with the replies unread on it
    assert store.collect() == 3
    assert [(r.applied, r.status, r.job.id if r.job else None) for r in results if r] == [
        (True, "scheduled", job_id) for job_id in jobs]
    # The lane keeps its one connection for the process's next call: none other.
    assert _in_use(store) == 1 and store.collect() == 0


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
    started = {job_id: _started(store, job_id) for job_id in ("l1", "l2")}
    for job_id, (occurrence, fence, known) in started.items():
        store.settle_soon(job_id, occurrence, 1, "complete", results.append, known=known,
                          fence=fence)
    assert store.lane is not None and store.lane.pending == 2
    store.lane._conn.disconnect()  # the connection breaks before the replies are read
    store.collect()
    assert results == [None, None] and _in_use(store) == 0
    # The connection went back to the pool closed: the next caller reconnects.
    assert store.now_ms() > 0



def test_a_server_that_never_ran_settle_hands_over_none_and_changes_nothing(
        store: Store) -> None:
    occurrence, fence, known = _started(store, "n")
    store.client.script_flush()
    results: list[SettleResult | None] = []
    store.settle_soon("n", occurrence, 1, "complete", results.append, known=known, fence=fence)
    store.collect()
    assert results == [None] and _status(store, "n") == "running"
    assert store.settle("n", occurrence, 1, "complete", fence=fence).applied  # loads it


def test_a_start_goes_behind_the_settles_sent_ahead_and_one_read_takes_every_reply(
        store: Store) -> None:
    """A worker's next start is sent on the lane too, behind the settles sent ahead:
    it needs no connection of its own, and its read hands the settles their replies."""
    occurrence, fence, known = _started(store, "s1")
    store.upsert(Job.from_dict({"id": "s2", "task": "tests.noop", "interval_s": 60,
                                "jitter_s": 0}))
    claimed = next(c for c in store.claim().jobs if c.job.id == "s2")
    store.routed([(claimed, "")])
    results: list[SettleResult | None] = []
    store.settle_soon("s1", occurrence, 1, "complete", results.append, known=known,
                      fence=fence)
    assert store.lane is not None and store.lane.pending == 1 and _in_use(store) == 1
    start = store.start("s2", claimed.occurrence, 1, delivery=claimed.deliveries,
                        task="tests.noop")
    assert start.status == "ok" and _status(store, "s2") == "running"
    assert [(r.applied, r.status) for r in results if r] == [(True, "scheduled")]
    assert store.lane.pending == 0 and _in_use(store) == 1  # the lane's own, no other
    # A server that lost its scripts: the lane's start gets no reply, and the usual
    # way loads the script and starts it.
    store.settle_soon("s2", claimed.occurrence, 1, "complete", results.append,
                      known=(start.definition or "", start.now_ms or 0), fence=start.fence)
    store.upsert(Job.from_dict({"id": "s3", "task": "tests.noop", "interval_s": 60,
                                "jitter_s": 0}))
    third = next(c for c in store.claim().jobs if c.job.id == "s3")
    store.routed([(third, "")])
    store.client.script_flush()
    assert store.start("s3", third.occurrence, 1, delivery=third.deliveries,
                       task="tests.noop").status == "ok"
    assert _status(store, "s3") == "running" and store.lane.pending == 0


def test_no_other_thread_takes_a_starts_reply(store: Store) -> None:
    """A start on the lane reads its own reply under the lane's lock: a collector
    thread reading the lane meanwhile hands over the settles' replies, never the
    start's, so the start never goes out twice (which would drop its delivery)."""
    started = {job_id: _started(store, job_id) for job_id in ("t1", "t2")}
    pending = []
    for i in range(40):
        job_id = f"u{i}"
        store.upsert(Job.from_dict({"id": job_id, "task": "tests.noop", "interval_s": 60,
                                    "jitter_s": 0}))
    for claimed in store.claim().jobs:
        if claimed.job.id.startswith("u"):
            store.routed([(claimed, "")])
            pending.append(claimed)
    results: list[SettleResult | None] = []
    for job_id, (occurrence, fence, known) in started.items():
        store.settle_soon(job_id, occurrence, 1, "complete", results.append, known=known,
                          fence=fence)
    stop = threading.Event()

    def collector() -> None:
        while not stop.is_set():
            store.collect()
    thread = threading.Thread(target=collector)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads take turns as often as the GIL lets them
    thread.start()
    try:
        statuses = [store.start(c.job.id, c.occurrence, 1, delivery=c.deliveries,
                                task="tests.noop").status for c in pending]
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switch)
    assert statuses == ["ok"] * len(pending)
    assert int(store.client.hget(store.keys.counters, "duplicates") or 0) == 0
    assert [(r.applied, r.status) for r in results if r] == [(True, "scheduled")] * 2


def test_a_forked_child_starts_with_an_empty_lane_of_its_own(store: Store) -> None:
    """A pool child forked while its parent has a settle on the lane, and while one of
    the parent's threads holds the lane's lock, neither reads the parent's reply nor
    waits on that lock: its lane starts empty, on a connection of its own. The
    parent's reply is still the parent's to read."""
    started = {job_id: _started(store, job_id) for job_id in ("f1", "f2")}
    results: list[SettleResult | None] = []
    occurrence, fence, known = started["f1"]
    store.settle_soon("f1", occurrence, 1, "complete", results.append, known=known,
                      fence=fence)
    assert store.lane is not None and store.lane.pending == 1
    lock = store.lane._lock
    lock.acquire()  # a thread of the parent's is reading the lane at the fork
    try:
        pid = os.fork()
        if pid == 0:  # the child reports through its exit code, and never hangs
            code = 1
            try:
                signal.alarm(10)
                empty = store.lane.pending == 0
                occurrence, fence, known = started["f2"]
                got: list[SettleResult | None] = []
                store.settle_soon("f2", occurrence, 1, "complete", got.append, known=known,
                                  fence=fence)
                store.collect()
                settled = [(r.applied, r.status) for r in got if r] == [(True, "scheduled")]
                code = 0 if empty and settled else 2
            finally:
                os._exit(code)
    finally:
        lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.collect() == 1
    assert [(r.applied, r.status) for r in results if r] == [(True, "scheduled")]


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
