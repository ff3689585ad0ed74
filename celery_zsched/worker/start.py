"""The start compare-and-set, run from ``Task.before_start`` in the process that runs
the task, and the hooks that install it on every task of the app."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from celery.exceptions import Ignore
from celery.utils.imports import symbol_by_name

from celery_zsched.core.errors import JobFailed, StoreUnavailable
from celery_zsched.core.telemetry import log_event
from celery_zsched.services.appstore import store_for_app
from celery_zsched.store import StartResult
from celery_zsched.worker import robots
from celery_zsched.worker.headers import MalformedHeaders, Occurrence, from_request
from celery_zsched.worker.heartbeat import heartbeat_for
from celery_zsched.worker.holds import holding_request
from celery_zsched.worker.settle import collect_sent, settle_occurrence, with_retries

logger = logging.getLogger("celery_zsched")


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
        occ = from_request(request)
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
        if not robots.permit(task.app, occ, request, result):
            raise Ignore()  # settled blocked_by_robots: the body never runs
        return
    if result.status == "refused":
        log_event("job_refused", logging.WARNING, job_id=occ.job_id, occurrence=occ.occurrence,
                  attempt=occ.attempt, delivery=occ.delivery, task_id=request.id,
                  task=task.name, reason=result.reason, found=result.found or None)
        raise Ignore()
    if result.status == "expired":
        log_event("job_expired", logging.WARNING, job_id=occ.job_id, occurrence=occ.occurrence,
                  attempt=occ.attempt, waited_ms=(result.now_ms or 0) - occ.promoted_ms)
        settle_occurrence(task.app, occ, "error", None, "expired", None, request.id)
    else:
        log_event("job_duplicate_dropped", logging.WARNING, job_id=occ.job_id,
                  occurrence=occ.occurrence, attempt=occ.attempt, task_id=request.id,
                  found=result.status, status=result.found or None)
    raise Ignore()


def _start_paced(app: Any, occ: Occurrence, task: str) -> StartResult:
    """The start compare-and-set; while the domain's start gate opens within a
    short wait (``wait``), sleep until then and try again."""
    store_for_app(app).learn_header(occ.job_id, occ.partition)
    while True:
        result: StartResult = with_retries("start", occ, lambda: store_for_app(app).start(
            occ.job_id, occ.occurrence, occ.attempt, occ.expires_ms, delivery=occ.delivery,
            task=task), START_RETRY_S)
        # This process's settles sent ahead went out before this start, so their
        # replies are all but certainly back too: read them now, at no wait.
        collect_sent(app)
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

    Each task's ``Request`` class (Celery's, or the task's own) is subclassed
    so that a message acknowledged as a pool process accepts it is held in
    Redis first (:func:`~celery_zsched.worker.holds.holding_request`).
    """
    classes = [app.Task, *(type(task) for task in app.tasks.values())]
    for cls in classes:
        current = cls.before_start
        if not getattr(current, "zsched", False):
            cls.before_start = _zsched_before_start(current)
        cls.Request = holding_request(symbol_by_name(cls.Request))
        throws = tuple(cls.throws)
        if not any(issubclass(JobFailed, kind) for kind in throws):
            cls.throws = (*throws, JobFailed)
