"""Settling an occurrence from its task's outcome, under the fence its start returned."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import current_task

from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.core.recrawl import Visit
from celery_zsched.core.telemetry import log_event
from celery_zsched.services import signals as zsched_signals
from celery_zsched.services import tracing
from celery_zsched.services.appstore import store_for_app
from celery_zsched.store import SettleResult, StartResult, Store
from celery_zsched.worker.headers import Occurrence
from celery_zsched.worker.heartbeat import heartbeat_for

logger = logging.getLogger("celery_zsched")
#: How long a settle keeps retrying while Redis is unreachable. After that the
#: lease runs out and the occurrence is redelivered, so nothing is lost.
SETTLE_RETRY_S = 60.0
#: How soon a settle sent ahead has its reply read when no start in the process
#: reads it first (an idle worker): only its log line and signals wait for it.
COLLECT_AFTER_S = 0.05


def report(outcome: str = "error", *, error: str = "", retry_after: float | None = None,
           status: int | None = None, changed: bool | None = None,
           signature: str | None = None, etag: str | None = None,
           last_modified: str | None = None) -> None:
    """Report the running task's outcome explicitly, instead of its return value.

    For example ``report("error", error="HTTP 429", status=429, retry_after=120)``
    makes a task that returns normally count as an error retried in 120 s, and
    (with pacing on) closes the domain for 120 s. ``report("complete", status=200)``
    reports a success with its status.

    What the fetch saw of the page feeds change-aware recrawl: ``changed``
    (whether the content changed since the last visit), or a ``signature`` (a
    hash of the content) from which the store decides; ``etag`` and
    ``last_modified`` are kept for the next conditional request (see
    :func:`celery_zsched.worker.validators`). A ``304`` is a visit without a change
    unless ``changed`` says otherwise. Bad values raise ``ValueError``.
    """
    if status == 304 and changed is None:
        changed = False
    visit = Visit(changed, signature, etag, last_modified)
    if outcome not in ("complete", "error"):
        raise ValueError(f"outcome must be 'complete' or 'error', got {outcome!r}")
    if status is not None and (isinstance(status, bool) or not isinstance(status, int)
                               or not 100 <= status <= 599):
        raise ValueError(f"status must be an HTTP status code (100-599), got {status!r}")
    request: Any = current_task.request
    request.zsched_outcome = (outcome, error, retry_after, status)
    request.zsched_visit = visit if visit.reported else None


def with_retries(what: str, occ: Occurrence, call: Callable[[], Any],
                  patience_s: float) -> Any:
    """``call()``, retried with backoff while Redis is unreachable, for ``patience_s`` at most."""
    deadline = time.monotonic() + patience_s
    delay = 0.2
    while True:
        try:
            return call()
        except StoreUnavailable as exc:
            if time.monotonic() + delay > deadline:
                raise
            logger.warning("zsched: %s of %s failed (%s); retrying in %.1fs",
                           what, occ.job_id, exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


def settle_occurrence(app: Any, occ: Occurrence, outcome: str, request: Any = None, error: str = "",
            retry_after: float | None = None, task_id: str | None = None,
            status: int | None = None, *, unfenced: bool = False,
            visit: Visit | None = None) -> None:
    """Settle ``occ``: as the execution ``request``'s start numbered (its fence), or,
    for a message that never started, as its delivery (``unfenced``: as whatever
    holds the occurrence, for an operator's terminate)."""
    # Start and promotion are read on Redis' clock; the duration on this host's
    # monotonic clock. So wait_ms and duration_ms never mix two hosts' clocks.
    # Due and promotion come from the start's reply (the store's record) when
    # there was one, not from headers a sender could have written anything in.
    start: StartResult | None = getattr(request, "zsched_start", None)
    due = start.due_ms if start is not None and start.due_ms is not None else occ.due_ms
    promoted = (start.promoted_ms if start is not None and start.promoted_ms is not None
                else occ.promoted_ms)
    fence = start.fence if start is not None else None
    started = getattr(request, "zsched_started_ms", None) if request is not None else None
    mono = getattr(request, "zsched_started_mono", None) if request is not None else None
    duration = int((time.monotonic() - mono) * 1000) if mono is not None else None
    # The definition the start returned, and Redis' clock now as the start's reading
    # plus this host's monotonic time since: the settle needs no read of its own.
    known = None
    if start is not None and start.definition is not None and start.now_ms is not None \
            and duration is not None:
        known = (start.definition, start.now_ms + duration)
    timings = {
        "task_id": task_id, "due_ms": due, "promoted_ms": promoted,
        "lateness_ms": promoted - due,
        "started_ms": int(started) if started else None,
        "finished_ms": int(started + duration) if started and duration is not None else None,
        "wait_ms": int(started - promoted) if started else None,
        "duration_ms": duration,
    }
    store = store_for_app(app)
    store.learn_header(occ.job_id, occ.partition)
    heartbeat_for(app, store).untrack(occ.job_id, occ.occurrence, occ.attempt)

    def settled(result: SettleResult | None) -> None:
        if result is None:  # sent ahead, and no result came back: settle the usual way
            try:
                result = with_retries("settle", occ, lambda: store.settle(
                    occ.job_id, occ.occurrence, occ.attempt, outcome, event=timings,
                    http_status=status, fence=fence, visit=visit), SETTLE_RETRY_S)
            except StoreUnavailable as exc:
                logger.error("zsched: giving up settling %s (%s); its lease will expire and "
                             "the occurrence will be redelivered", occ.job_id, exc)
                return
        _after_settle(app, store, occ, outcome, result, fence, error, status, timings,
                      request)

    # Traced settles wait for their reply: the settle is an event on the task's span,
    # which has ended by the time a reply sent ahead is read.
    if known is not None and fence is not None and outcome == "complete" and _AHEAD.on \
            and tracing.active() is None:
        # The hot case: the task's slot does not wait for the reply (store.lane).
        try:
            store.settle_soon(occ.job_id, occ.occurrence, occ.attempt, outcome, settled,
                              known=known, event=timings, http_status=status, fence=fence,
                              visit=visit)
        except StoreUnavailable:
            pass  # not sent: the usual way, with its retries
        else:
            _collector_for(store).soon()
            return
    try:
        result = with_retries("settle", occ, lambda: store.settle(
            occ.job_id, occ.occurrence, occ.attempt, outcome, error=error,
            retry_after_s=retry_after, event=timings, http_status=status,
            # A message from before fencing has no delivery number: unfenced, as then.
            fence=fence, delivery=None if fence is not None or unfenced else occ.delivery,
            known=known, visit=visit),
            SETTLE_RETRY_S)
        # Settled, it may move (a changed domain): its next message says where.
        store.forget(occ.job_id)
    except StoreUnavailable as exc:
        logger.error("zsched: giving up settling %s (%s); its lease will expire and "
                     "the occurrence will be redelivered", occ.job_id, exc)
        return
    _after_settle(app, store, occ, outcome, result, fence, error, status, timings, request)


def _after_settle(app: Any, store: Store, occ: Occurrence, outcome: str, result: SettleResult,
                  fence: int | None, error: str, status: int | None,
                  timings: dict[str, Any], request: Any) -> None:
    """Trace and log a settle's result and raise the signals it calls for."""
    tracer = tracing.active()
    if tracer is not None:
        try:
            tracer.settled(request, occ.job_id, occ.occurrence, occ.attempt, outcome, result,
                           fence)
        except Exception:  # the settle is done: tracing must never fail the task's hook
            logger.exception("zsched: tracing the settle of %s failed", occ.job_id)
    if not result.applied and fence is not None and result.status == "stale":
        # This execution's lease lapsed and the occurrence moved on (reaped,
        # handed to another worker): fencing kept it from changing anything.
        log_event("job_fenced", logging.WARNING, job_id=occ.job_id, occurrence=occ.occurrence,
                  attempt=occ.attempt, fence=fence, outcome=outcome)
    event = "job_complete" if outcome == "complete" else "job_error"
    log_event(event, logging.INFO if outcome == "complete" else logging.WARNING,
              job_id=occ.job_id, occurrence=occ.occurrence, attempt=occ.attempt,
              status=result.label, applied=result.applied, error=error or None,
              http_status=status,
              lateness_ms=timings["lateness_ms"], wait_ms=timings["wait_ms"],
              duration_ms=timings["duration_ms"], next_run_at=result.next_due_ms)
    try:
        zsched_signals.after_settle(app, occ.job_id, occ.occurrence, occ.attempt, outcome,
                                    error, result, store.settings.notify_streak)
    except Exception:  # the settle is done: a signal must never fail the task's hook
        logger.exception("zsched: signalling the settle of %s failed", occ.job_id)


class _Ahead:
    #: Whether a completed task's settle is sent ahead of its reply: in worker
    #: processes (:func:`send_ahead`), not in a caller that runs a task eagerly.
    on = False


_AHEAD = _Ahead()


def send_ahead() -> None:
    """From now on, this process (and its forks) sends completed tasks' settles ahead of
    their replies: the store applies each as it arrives; the reply is read at the
    process's next start or within :data:`COLLECT_AFTER_S`."""
    _AHEAD.on = True


class _Collector:
    """Reads the replies of settles sent ahead when no start came to read them."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def soon(self) -> None:
        if not self._wake.is_set():
            self._wake.set()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="zsched-collect",
                                            daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(COLLECT_AFTER_S)
            self._wake.clear()
            try:
                self.store.collect()
            except Exception:  # the thread must outlive any one bad reply
                logger.exception("zsched: reading settle replies failed")


_collectors: dict[int, _Collector] = {}
_collectors_lock = threading.Lock()


def _collector_for(store: Store) -> _Collector:
    with _collectors_lock:
        found = _collectors.get(id(store))
        if found is None:
            found = _collectors[id(store)] = _Collector(store)
        return found


def collect_sent(app: Any) -> None:
    """Read the replies of ``app``'s settles sent ahead from this process, if any."""
    try:
        store_for_app(app).collect()
    except StoreUnavailable as exc:
        logger.warning("zsched: could not read the replies of settles sent ahead: %s", exc)


def collect_all() -> None:
    """Read every reply of a settle sent ahead in this process now (a process that stops)."""
    with _collectors_lock:
        stores = [each.store for each in _collectors.values()]
    for store in stores:
        try:
            store.collect()
        except StoreUnavailable as exc:
            logger.warning("zsched: could not read the replies of settles sent ahead: %s", exc)


def _forget_after_fork() -> None:
    # A forked pool child has no collector thread of its own yet, and its store
    # lane starts empty.
    global _collectors_lock
    _collectors_lock = threading.Lock()
    _collectors.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
