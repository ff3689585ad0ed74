"""Worker-side signal handlers that settle each job from its task's outcome.

Install them with one line in the module that defines your Celery app::

    import celery_zsched.worker  # noqa: F401

(or call :func:`install`). Tasks need no decorator: any task published by the
zsched scheduler carries headers naming its job, occurrence and attempt.

When a worker starts such a task, one compare-and-set marks the occurrence
running (``Store.start``) from Celery's ``Task.before_start`` hook, which the
worker installs on every task at ``worker_init``. A delivery that finds it
running or settled already is dropped (``Ignore``) without running the body,
and so is one that was never promoted (a forged or stray message, one under
another task name) or whose zsched headers are malformed: one log line each.
While the task runs, this process's :class:`~celery_zsched.worker.heartbeat.Heartbeat`
keeps its execution lease alive under the fence its start returned, which the
settle presents too. The worker's main process holds every message it
received and has not started yet (``task_received``), so if it dies they are
republished one lease later, not after the broker's visibility timeout.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import current_app, current_task, signals
from celery.exceptions import Ignore
from kombu.transport import virtual

from celery_zsched.core.errors import JobFailed, StoreUnavailable
from celery_zsched.core.http_status import retry_after_of, status_of
from celery_zsched.core.telemetry import log_event
from celery_zsched.services import extensions
from celery_zsched.services import signals as zsched_signals
from celery_zsched.services.appstore import store_for_app
from celery_zsched.store import StartResult, Store
from celery_zsched.worker.heartbeat import heartbeat_for

logger = logging.getLogger("celery_zsched")
_UID = "celery_zsched.worker"
#: How long a settle keeps retrying while Redis is unreachable. After that the
#: lease runs out and the occurrence is redelivered, so nothing is lost.
SETTLE_RETRY_S = 60.0


@dataclass(frozen=True)
class Occurrence:
    """What the headers of a zsched message say."""

    job_id: str
    occurrence: int
    attempt: int
    due_ms: int
    promoted_ms: int
    expires_ms: int | None = None
    #: Which publish of this attempt the message is (``None``: a message from
    #: before fencing); start accepts only one beat made.
    delivery: int | None = None


class MalformedHeaders(ValueError):
    """A message carries a ``zsched_job_id`` but its other zsched headers are not valid."""


#: Bounds of the integer headers: epoch ms and counts, never beyond what a
#: JSON number (and the run history's columns) hold exactly.
_MAX_MS = 2**53 - 1
_MAX_COUNT = 1_000_000


def _header_int(get: Callable[[str], Any], name: str, low: int, high: int,
                default: int | None) -> int | None:
    value = get(name)
    if value is None:
        if default is None and name in _REQUIRED:
            raise MalformedHeaders(f"{name} is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise MalformedHeaders(f"{name} must be an integer in [{low}, {high}], got {value!r:.40}")
    return value


_REQUIRED = ("zsched_occurrence", "zsched_attempt")


def occurrence_of(headers: Any) -> Occurrence | None:
    """Parse zsched headers from a mapping or an object with attributes.

    ``None`` when there are none (not a zsched message); raises
    :class:`MalformedHeaders` when a ``zsched_job_id`` comes with headers that
    are missing, mistyped or out of range.
    """
    def get(name: str) -> Any:
        if isinstance(headers, dict):
            return headers.get(name)
        return getattr(headers, name, None)
    job_id = get("zsched_job_id")
    if job_id is None or job_id == "":
        return None
    if not isinstance(job_id, str) or len(job_id) > 200:
        raise MalformedHeaders(f"zsched_job_id must be a job id, got {job_id!r:.40}")
    occurrence = _header_int(get, "zsched_occurrence", 0, _MAX_MS, None)
    attempt = _header_int(get, "zsched_attempt", 1, _MAX_COUNT, None)
    due = _header_int(get, "zsched_due_ms", 0, _MAX_MS, 0)
    promoted = _header_int(get, "zsched_promoted_ms", 0, _MAX_MS, 0)
    expires = _header_int(get, "zsched_expires_ms", 0, _MAX_MS, None)
    delivery = _header_int(get, "zsched_delivery", 1, _MAX_COUNT, None)
    assert occurrence is not None and attempt is not None  # required: raised above
    return Occurrence(job_id, occurrence, attempt, due or 0, promoted or 0, expires, delivery)


def _from_request(request: Any) -> Occurrence | None:
    """The occurrence of ``request``; raises :class:`MalformedHeaders` for bad headers."""
    if request is None:
        return None
    for source in (getattr(request, "headers", None), getattr(request, "request_dict", None),
                   getattr(request, "_request_dict", None), request):
        if source is not None:
            found = occurrence_of(source)
            if found is not None:
                return found
    return None


def _occurrence_or_none(request: Any) -> Occurrence | None:
    """The occurrence of ``request``, or ``None`` for one with malformed headers: only
    the start reports those (once), every later hook ignores them."""
    try:
        return _from_request(request)
    except MalformedHeaders:
        return None


def report(outcome: str = "error", *, error: str = "", retry_after: float | None = None,
           status: int | None = None) -> None:
    """Report the running task's outcome explicitly, instead of its return value.

    For example ``report("error", error="HTTP 429", status=429, retry_after=120)``
    makes a task that returns normally count as an error retried in 120 s, and
    (with pacing on) closes the domain for 120 s. ``report("complete", status=200)``
    reports a success with its status.
    """
    if outcome not in ("complete", "error"):
        raise ValueError(f"outcome must be 'complete' or 'error', got {outcome!r}")
    if status is not None and (isinstance(status, bool) or not isinstance(status, int)
                               or not 100 <= status <= 599):
        raise ValueError(f"status must be an HTTP status code (100-599), got {status!r}")
    request: Any = current_task.request
    request.zsched_outcome = (outcome, error, retry_after, status)


def _with_retries(what: str, occ: Occurrence, call: Callable[[], Any],
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


def _settle(app: Any, occ: Occurrence, outcome: str, request: Any = None, error: str = "",
            retry_after: float | None = None, task_id: str | None = None,
            status: int | None = None, *, unfenced: bool = False) -> None:
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
    heartbeat_for(app, store).untrack(occ.job_id, occ.occurrence, occ.attempt)
    try:
        result = _with_retries("settle", occ, lambda: store.settle(
            occ.job_id, occ.occurrence, occ.attempt, outcome, error=error,
            retry_after_s=retry_after, event=timings, http_status=status,
            # A message from before fencing has no delivery number: unfenced, as then.
            fence=fence, delivery=None if fence is not None or unfenced else occ.delivery,
            known=known),
            SETTLE_RETRY_S)
    except StoreUnavailable as exc:
        logger.error("zsched: giving up settling %s (%s); its lease will expire and "
                     "the occurrence will be redelivered", occ.job_id, exc)
        return
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


def _app_of(sender: Any) -> Any:
    return getattr(sender, "app", None) or current_app


#: How long a start keeps retrying while Redis is unreachable before the
#: message is handed back to the broker (Celery retry) for later.
START_RETRY_S = 5.0
#: Countdown of that Celery retry.
START_REQUEUE_S = 10.0


def start_occurrence(task: Any) -> None:
    """Mark the delivered occurrence running, or drop this delivery.

    Called from ``before_start`` in the process that runs the task. Raises
    ``Ignore`` (the body does not run, no settle) for a duplicate delivery, a
    refused one (never promoted so, or under another task name), one with
    malformed zsched headers, and for an occurrence that expired, which is
    settled as an error first.
    """
    request = task.request
    if getattr(request, "zsched_start", None) is not None:
        return
    try:
        occ = _from_request(request)
    except MalformedHeaders as exc:
        log_event("job_malformed_dropped", logging.WARNING, task_id=request.id,
                  task=task.name, error=str(exc))
        raise Ignore() from None
    if occ is None:
        return
    try:
        # store_for_app inside the retries: a Redis Cluster client connects as it
        # is built, so a cluster that is down at the first task is an outage too.
        result = _start_paced(task.app, occ, task.name)
    except StoreUnavailable as exc:
        # Without a start the run is not protected against a duplicate: hand the
        # message back to the broker (same task id) and try again later.
        logger.warning("zsched: cannot start %s (%s); requeued in %.0fs",
                       occ.job_id, exc, START_REQUEUE_S)
        raise task.retry(countdown=START_REQUEUE_S, max_retries=None) from exc
    request.zsched_start = result
    # This process no longer holds the message (solo, threads and green pools
    # hold and run in one process; a prefork parent hears it from its beat).
    heartbeat = heartbeat_for(task.app, store_for_app(task.app))
    heartbeat.unhold(occ.job_id)
    if result.status == "deferred":
        # The domain's gate stays closed (Retry-After, an open breaker): the
        # occurrence is back in the schedule and will be published again.
        log_event("job_deferred", job_id=occ.job_id, occurrence=occ.occurrence,
                  attempt=occ.attempt, until_ms=result.until_ms)
        raise Ignore()
    if result.status == "ok":
        request.zsched_started_ms = result.now_ms
        request.zsched_started_mono = time.monotonic()
        heartbeat.track(occ.job_id, occ.occurrence, occ.attempt, result.fence)
        return
    if result.status == "refused":
        log_event("job_refused", logging.WARNING, job_id=occ.job_id, occurrence=occ.occurrence,
                  attempt=occ.attempt, delivery=occ.delivery, task_id=request.id,
                  task=task.name, reason=result.reason, found=result.found or None)
        raise Ignore()
    if result.status == "expired":
        log_event("job_expired", logging.WARNING, job_id=occ.job_id, occurrence=occ.occurrence,
                  attempt=occ.attempt, waited_ms=(result.now_ms or 0) - occ.promoted_ms)
        _settle(task.app, occ, "error", None, "expired", None, request.id)
    else:
        log_event("job_duplicate_dropped", logging.WARNING, job_id=occ.job_id,
                  occurrence=occ.occurrence, attempt=occ.attempt, task_id=request.id,
                  found=result.status, status=result.found or None)
    raise Ignore()


def _start_paced(app: Any, occ: Occurrence, task: str) -> StartResult:
    """The start compare-and-set; while the domain's start gate opens within a
    short wait (``wait``), sleep until then and try again."""
    while True:
        result: StartResult = _with_retries("start", occ, lambda: store_for_app(app).start(
            occ.job_id, occ.occurrence, occ.attempt, occ.expires_ms, delivery=occ.delivery,
            task=task), START_RETRY_S)
        if result.status != "wait":
            return result
        time.sleep((result.until_ms or 1) / 1000)


def _zsched_before_start(original: Callable[..., Any]) -> Callable[..., Any]:
    def before_start(self: Any, task_id: str, args: Any, kwargs: Any) -> Any:
        start_occurrence(self)
        return original(self, task_id, args, kwargs)
    before_start.zsched = True  # type: ignore[attr-defined]
    return before_start


def install_start(app: Any) -> None:
    """Install the start compare-and-set on every task of ``app`` (idempotent).

    Celery calls ``Task.before_start`` right before the body, in the process
    that runs it, and an ``Ignore`` raised there skips the body. The app's base
    task class is patched first, so tasks registered later inherit it; a task
    class with its own ``before_start`` keeps it, called after the start.

    :class:`~celery_zsched.core.errors.JobFailed` is also added to each task's
    ``throws``, Celery's documented list of expected errors: it is how a task
    reports an error (an HTTP 429 with ``retry_after``), not a bug, so Celery
    logs it in one INFO line without a traceback instead of an ERROR with one.
    The settle logs the failure itself, as one ``job_error`` WARNING line.
    """
    classes = [app.Task, *(type(task) for task in app.tasks.values())]
    for cls in classes:
        current = cls.before_start
        if not getattr(current, "zsched", False):
            cls.before_start = _zsched_before_start(current)
        throws = tuple(cls.throws)
        if not any(issubclass(JobFailed, kind) for kind in throws):
            cls.throws = (*throws, JobFailed)


def on_worker_init(sender: Any = None, **_: Any) -> None:
    """Install the start hook before the worker builds its task tracers, and start the
    extensions (the notifiers the settings switch on) before the pool forks: children
    inherit them."""
    app = _app_of(sender)
    install_start(app)
    extensions.start(app, "worker")


def on_worker_ready(sender: Any = None, **_: Any) -> None:
    """Announce this worker as alive for as long as it runs."""
    app = _app_of(sender)
    name = _worker_name(sender)
    # A Redis outage is logged by the beat itself; the thread keeps trying.
    heartbeat_for(app, store_for_app(app)).announce(name, _consumed_queues(sender, app))


def _consumed_queues(consumer: Any, app: Any) -> tuple[str, ...]:
    """Names of the queues this worker consumes (``-Q``, else the app's defaults)."""
    task_consumer = getattr(consumer, "task_consumer", None)
    queues = getattr(task_consumer, "queues", None) or app.amqp.queues.consume_from.values()
    return tuple(sorted({str(q.name) for q in queues}))


def on_worker_shutdown(sender: Any = None, **_: Any) -> None:
    """A clean shutdown: stop announcing the worker (running leases are still kept),
    and stop the extensions (the notifiers deliver what is queued, a bounded wait)."""
    app = _app_of(sender)
    heartbeat_for(app, store_for_app(app)).retire()
    extensions.stop("worker")


def on_process_shutdown(**_: Any) -> None:
    """A pool child exits: its extensions stop (its queued notices are delivered)."""
    extensions.stop("worker_process")


def on_prerun(sender: Any = None, task: Any = None, **_: Any) -> None:
    """Record a start time on this host's clock; ``before_start`` replaces it with Redis'.

    It stays only for a task whose class got no ``before_start`` hook (one
    registered after the worker started): that task runs without a start.
    """
    if task is not None and getattr(task.request, "zsched_start", None) is None \
            and _occurrence_or_none(task.request) is not None:
        task.request.zsched_started_mono = time.monotonic()
        task.request.zsched_started_ms = time.time() * 1000


def on_success(sender: Any = None, **_: Any) -> None:
    """Complete, or the outcome the task reported with :func:`report`."""
    request = sender.request
    occ = _occurrence_or_none(request)
    if occ is None:
        return
    outcome, error, retry_after, status = (getattr(request, "zsched_outcome", None)
                                           or ("complete", "", None, None))
    _settle(_app_of(sender), occ, outcome, request, error, retry_after, request.id, status)


def on_failure(sender: Any = None, task_id: str | None = None,
               exception: BaseException | None = None, **_: Any) -> None:
    """Error, with the exception text, and the HTTP status and Retry-After it carries
    (``JobFailed``, or an HTTP client's error: see :mod:`celery_zsched.core.http_status`)."""
    request = getattr(sender, "request", None)
    occ = _occurrence_or_none(request)
    if occ is None:
        return
    error = f"{type(exception).__name__}: {exception}" if exception else "failed"
    status = status_of(exception) if exception is not None else None
    retry_after = retry_after_of(exception) if exception is not None else None
    _settle(_app_of(sender), occ, "error", request, error, retry_after, task_id, status)


def on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
    """A Celery retry is not an outcome yet: the occurrence is queued again for the retry."""
    occ = _occurrence_or_none(request)
    if occ is None:
        return
    when = getattr(reason, "when", None)
    countdown = 0.0
    if isinstance(when, int | float):
        countdown = float(when)
    elif when is not None and hasattr(when, "timestamp"):
        countdown = max(0.0, when.timestamp() - time.time())
    app = _app_of(sender)
    store: Store = store_for_app(app)
    heartbeat_for(app, store).untrack(occ.job_id, occ.occurrence, occ.attempt)
    start: StartResult | None = getattr(request, "zsched_start", None)
    try:
        store.retrying(occ.job_id, occ.occurrence, occ.attempt, countdown,
                       fence=start.fence if start is not None else None)
    except StoreUnavailable as exc:
        logger.warning("zsched: could not requeue %s for its retry: %s", occ.job_id, exc)
    log_event("job_retry", job_id=occ.job_id, occurrence=occ.occurrence, countdown_s=countdown)


def on_revoked(sender: Any = None, request: Any = None, terminated: bool = False,
               expired: bool = False, **_: Any) -> None:
    """A revoked or expired message settles as an error.

    One that never started settles as its delivery (while its occurrence is
    queued). A terminated one was running in a pool process whose start this
    process did not see: the operator's terminate is trusted to settle the
    occurrence unfenced, as whatever holds it.
    """
    occ = _occurrence_or_none(request)
    if occ is None:
        return
    reason = "expired" if expired else ("terminated" if terminated else "revoked")
    _settle(_app_of(sender), occ, "error", None, reason, None, getattr(request, "id", None),
            unfenced=terminated)


def on_rejected(message: Any = None, exc: Any = None, **_: Any) -> None:
    """A message the worker rejected (or whose task is unknown) settles as an error."""
    try:
        occ = occurrence_of(getattr(message, "headers", None) or {})
    except MalformedHeaders:
        return
    if occ is None:
        return
    _settle(current_app, occ, "error", None, f"rejected: {exc}", None, None)


def on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    """The worker received a message (main process): hold it until it starts.

    Only on brokers that keep a dead consumer's unacknowledged messages until a
    visibility timeout (kombu's virtual transports: Redis, SQS, ...). RabbitMQ
    requeues them the moment the connection dies, so it needs no hold.
    """
    occ = _occurrence_or_none(request)
    if occ is None or not _broker_keeps_unacked(sender):
        return
    app = _app_of(sender)
    task = str(getattr(request, "name", "") or getattr(request, "task_name", ""))
    delivery = occ.delivery if occ.delivery is not None else 1
    heartbeat_for(app, store_for_app(app)).hold(
        request, (occ.job_id, occ.occurrence, occ.attempt, delivery, task), _worker_name(sender))


def _broker_keeps_unacked(consumer: Any) -> bool:
    transport = getattr(getattr(consumer, "connection", None), "transport", None)
    return isinstance(transport, virtual.Transport)


def _worker_name(consumer: Any) -> str:
    """This worker process, as the store's ``workers`` set and holds name it."""
    return f"{getattr(consumer, 'hostname', None) or 'worker'}:{os.getpid()}"


def install() -> None:
    """Connect the handlers (idempotent). Importing this module already does."""
    signals.worker_init.connect(on_worker_init, weak=False, dispatch_uid=_UID + ".init")
    signals.worker_ready.connect(on_worker_ready, weak=False, dispatch_uid=_UID + ".ready")
    signals.worker_shutdown.connect(on_worker_shutdown, weak=False,
                                    dispatch_uid=_UID + ".shutdown")
    signals.worker_process_shutdown.connect(on_process_shutdown, weak=False,
                                            dispatch_uid=_UID + ".process_shutdown")
    signals.task_prerun.connect(on_prerun, weak=False, dispatch_uid=_UID + ".prerun")
    signals.task_received.connect(on_received, weak=False, dispatch_uid=_UID + ".received")
    signals.task_success.connect(on_success, weak=False, dispatch_uid=_UID + ".success")
    signals.task_failure.connect(on_failure, weak=False, dispatch_uid=_UID + ".failure")
    signals.task_retry.connect(on_retry, weak=False, dispatch_uid=_UID + ".retry")
    signals.task_revoked.connect(on_revoked, weak=False, dispatch_uid=_UID + ".revoked")
    signals.task_rejected.connect(on_rejected, weak=False, dispatch_uid=_UID + ".rejected")
    signals.task_unknown.connect(on_rejected, weak=False, dispatch_uid=_UID + ".unknown")


install()
