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
settle presents too. A completed task's settle is sent without waiting for its
reply, which the process reads at its next start (:mod:`celery_zsched.store.lane`).
The worker's main process holds every message it
received and has not started yet, so if it dies they are republished one lease
later, not after the broker's visibility timeout (:mod:`~celery_zsched.worker.holds`).

The parts: :mod:`~celery_zsched.worker.headers` (what a message's headers say),
:mod:`~celery_zsched.worker.start`, :mod:`~celery_zsched.worker.settle`,
:mod:`~celery_zsched.worker.holds` and :mod:`~celery_zsched.worker.heartbeat`;
this module connects them to Celery's signals.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import current_app, signals

from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.core.http_status import retry_after_of, status_of
from celery_zsched.core.telemetry import log_event
from celery_zsched.services import extensions
from celery_zsched.services.appstore import store_for_app
from celery_zsched.store import StartResult, Store
from celery_zsched.worker.headers import (
    MalformedHeaders,
    Occurrence,
    occurrence_of,
    occurrence_or_none,
)
from celery_zsched.worker.heartbeat import heartbeat_for
from celery_zsched.worker.holds import on_received, worker_name
from celery_zsched.worker.settle import collect_all, report, send_ahead, settle_occurrence
from celery_zsched.worker.start import install_start, start_occurrence
from celery_zsched.worker.validators import validators, visit_of

__all__ = ["MalformedHeaders", "Occurrence", "install", "install_start", "occurrence_of",
           "report", "start_occurrence", "validators"]

logger = logging.getLogger("celery_zsched")
_UID = "celery_zsched.worker"


def _app_of(sender: Any) -> Any:
    return getattr(sender, "app", None) or current_app


def on_worker_init(sender: Any = None, **_: Any) -> None:
    """Install the start hook before the worker builds its task tracers, and start the
    extensions (the notifiers the settings switch on) before the pool forks: children
    inherit them."""
    app = _app_of(sender)
    install_start(app)
    send_ahead()
    extensions.start(app, "worker")


def on_worker_ready(sender: Any = None, **_: Any) -> None:
    """Announce this worker as alive for as long as it runs."""
    app = _app_of(sender)
    name = worker_name(getattr(sender, "hostname", None))
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
    collect_all()  # a solo, threads or green pool ran its tasks in this process
    heartbeat_for(app, store_for_app(app)).retire()
    extensions.stop("worker")


def on_process_init(**_: Any) -> None:
    """A prefork pool process starts: its store's lane keeps its connection, which every
    execution's settle and start use (the main process's holds still give theirs back)."""
    try:
        lane = store_for_app(current_app).lane
    except Exception:  # only a saving: the settings' own errors surface at the first task
        logger.exception("zsched: the pool process's store could not be built")
        return
    if lane is not None:
        lane.keep = True


def on_process_shutdown(**_: Any) -> None:
    """A pool child exits: its extensions stop (its queued notices are delivered)."""
    extensions.stop("worker_process")


def on_prerun(sender: Any = None, task: Any = None, **_: Any) -> None:
    """Record a start time on this host's clock; ``before_start`` replaces it with Redis'.

    It stays only for a task whose class got no ``before_start`` hook (one
    registered after the worker started): that task runs without a start.
    """
    if task is None or getattr(task.before_start, "zsched", False):
        return  # the start hook runs next and records Redis' time itself
    if getattr(task.request, "zsched_start", None) is None \
            and occurrence_or_none(task.request) is not None:
        task.request.zsched_started_mono = time.monotonic()
        task.request.zsched_started_ms = time.time() * 1000


def on_success(sender: Any = None, **_: Any) -> None:
    """Complete, or the outcome the task reported with :func:`report`."""
    request = sender.request
    occ = occurrence_or_none(request)
    if occ is None:
        return
    outcome, error, retry_after, status = (getattr(request, "zsched_outcome", None)
                                           or ("complete", "", None, None))
    settle_occurrence(_app_of(sender), occ, outcome, request, error, retry_after, request.id,
                      status, visit=getattr(request, "zsched_visit", None))


def on_failure(sender: Any = None, task_id: str | None = None,
               exception: BaseException | None = None, **_: Any) -> None:
    """Error, with the exception text, and the HTTP status and Retry-After it carries
    (``JobFailed``, or an HTTP client's error: see :mod:`celery_zsched.core.http_status`)."""
    request = getattr(sender, "request", None)
    occ = occurrence_or_none(request)
    if occ is None:
        return
    error = f"{type(exception).__name__}: {exception}" if exception else "failed"
    status = status_of(exception) if exception is not None else None
    retry_after = retry_after_of(exception) if exception is not None else None
    settle_occurrence(_app_of(sender), occ, "error", request, error, retry_after, task_id, status,
                      visit=visit_of(exception, status))


def on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
    """A Celery retry is not an outcome yet: the occurrence is queued again for the retry."""
    occ = occurrence_or_none(request)
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
    occ = occurrence_or_none(request)
    if occ is None:
        return
    reason = "expired" if expired else ("terminated" if terminated else "revoked")
    settle_occurrence(_app_of(sender), occ, "error", None, reason, None,
                      getattr(request, "id", None), unfenced=terminated)


def on_rejected(message: Any = None, exc: Any = None, **_: Any) -> None:
    """A message the worker rejected (or whose task is unknown) settles as an error."""
    try:
        occ = occurrence_of(getattr(message, "headers", None) or {})
    except MalformedHeaders:
        return
    if occ is None:
        return
    settle_occurrence(current_app, occ, "error", None, f"rejected: {exc}", None, None)


def install() -> None:
    """Connect the handlers (idempotent). Importing this module already does."""
    signals.worker_init.connect(on_worker_init, weak=False, dispatch_uid=_UID + ".init")
    signals.worker_ready.connect(on_worker_ready, weak=False, dispatch_uid=_UID + ".ready")
    signals.worker_shutdown.connect(on_worker_shutdown, weak=False,
                                    dispatch_uid=_UID + ".shutdown")
    signals.worker_process_init.connect(on_process_init, weak=False,
                                        dispatch_uid=_UID + ".process_init")
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
