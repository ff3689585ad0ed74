"""Worker-side signal handlers that settle each job from its task's outcome.

Install them with one line in the module that defines your Celery app::

    import celery_zsched.worker  # noqa: F401

(or call :func:`install`). Tasks need no decorator: any task published by the
zsched scheduler carries headers naming its job, occurrence and attempt.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from celery import current_app, current_task, signals

from .appstore import store_for_app
from .errors import StoreUnavailable
from .telemetry import log_event

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


def occurrence_of(headers: Any) -> Occurrence | None:
    """Parse zsched headers from a mapping or an object with attributes."""
    def get(name: str) -> Any:
        if isinstance(headers, dict):
            return headers.get(name)
        return getattr(headers, name, None)
    job_id = get("zsched_job_id")
    if not job_id:
        return None
    return Occurrence(str(job_id), int(get("zsched_occurrence")), int(get("zsched_attempt")),
                      int(get("zsched_due_ms") or 0), int(get("zsched_promoted_ms") or 0))


def _from_request(request: Any) -> Occurrence | None:
    if request is None:
        return None
    for source in (getattr(request, "headers", None), getattr(request, "request_dict", None),
                   getattr(request, "_request_dict", None), request):
        if source is not None:
            found = occurrence_of(source)
            if found is not None:
                return found
    return None


def report(outcome: str = "error", *, error: str = "", retry_after: float | None = None) -> None:
    """Report the running task's outcome explicitly, instead of its return value.

    For example ``report("error", error="HTTP 429", retry_after=120)`` makes a
    task that returns normally count as an error retried in 120 s.
    """
    if outcome not in ("complete", "error"):
        raise ValueError(f"outcome must be 'complete' or 'error', got {outcome!r}")
    request: Any = current_task.request
    request.zsched_outcome = (outcome, error, retry_after)


def _settle(app: Any, occ: Occurrence, outcome: str, request: Any = None, error: str = "",
            retry_after: float | None = None, task_id: str | None = None) -> None:
    finished = time.time() * 1000
    started = getattr(request, "zsched_started_ms", None) if request is not None else None
    timings = {
        "task_id": task_id, "due_ms": occ.due_ms, "promoted_ms": occ.promoted_ms,
        "lateness_ms": occ.promoted_ms - occ.due_ms,
        "started_ms": int(started) if started else None, "finished_ms": int(finished),
        "wait_ms": int(started - occ.promoted_ms) if started else None,
        "duration_ms": int(finished - started) if started else None,
    }
    store = store_for_app(app)
    deadline = time.monotonic() + SETTLE_RETRY_S
    delay = 0.2
    while True:
        try:
            result = store.settle(occ.job_id, occ.occurrence, occ.attempt, outcome,
                                  error=error, retry_after_s=retry_after, event=timings)
            break
        except StoreUnavailable as exc:
            if time.monotonic() + delay > deadline:
                logger.error("zsched: giving up settling %s (%s); its lease will expire and "
                             "the occurrence will be redelivered", occ.job_id, exc)
                return
            logger.warning("zsched: settle of %s failed (%s); retrying in %.1fs",
                           occ.job_id, exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
    event = "job_complete" if outcome == "complete" else "job_error"
    log_event(event, logging.INFO if outcome == "complete" else logging.WARNING,
              job_id=occ.job_id, occurrence=occ.occurrence, attempt=occ.attempt,
              status=result.label, applied=result.applied, error=error or None,
              lateness_ms=timings["lateness_ms"], wait_ms=timings["wait_ms"],
              duration_ms=timings["duration_ms"], next_run_at=result.next_due_ms)


def _app_of(sender: Any) -> Any:
    return getattr(sender, "app", None) or current_app


def on_prerun(sender: Any = None, task: Any = None, **_: Any) -> None:
    """Record when the task started (for wait_ms and duration_ms)."""
    if task is not None and _from_request(task.request) is not None:
        task.request.zsched_started_ms = time.time() * 1000


def on_success(sender: Any = None, **_: Any) -> None:
    """Complete, or the outcome the task reported with :func:`report`."""
    request = sender.request
    occ = _from_request(request)
    if occ is None:
        return
    outcome, error, retry_after = getattr(request, "zsched_outcome", None) or ("complete", "", None)
    _settle(_app_of(sender), occ, outcome, request, error, retry_after, request.id)


def on_failure(sender: Any = None, task_id: str | None = None,
               exception: BaseException | None = None, **_: Any) -> None:
    """Error, with the exception text; a ``retry_after`` attribute sets the retry delay."""
    request = getattr(sender, "request", None)
    occ = _from_request(request)
    if occ is None:
        return
    error = f"{type(exception).__name__}: {exception}" if exception else "failed"
    retry_after = getattr(exception, "retry_after", None)
    _settle(_app_of(sender), occ, "error", request, error,
            float(retry_after) if isinstance(retry_after, int | float) else None, task_id)


def on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
    """A Celery retry is not an outcome yet: extend the lease past its countdown."""
    occ = _from_request(request)
    if occ is None:
        return
    when = getattr(reason, "when", None)
    countdown = 0.0
    if isinstance(when, int | float):
        countdown = float(when)
    elif when is not None and hasattr(when, "timestamp"):
        countdown = max(0.0, when.timestamp() - time.time())
    store = store_for_app(_app_of(sender))
    try:
        store.extend(occ.job_id, occ.occurrence, occ.attempt, countdown + store.settings.lease_s)
    except StoreUnavailable as exc:
        logger.warning("zsched: could not extend the lease of %s: %s", occ.job_id, exc)
    log_event("job_retry", job_id=occ.job_id, occurrence=occ.occurrence, countdown_s=countdown)


def on_revoked(sender: Any = None, request: Any = None, terminated: bool = False,
               expired: bool = False, **_: Any) -> None:
    """A revoked or expired message settles as an error."""
    occ = _from_request(request)
    if occ is None:
        return
    reason = "expired" if expired else ("terminated" if terminated else "revoked")
    _settle(_app_of(sender), occ, "error", None, reason, None, getattr(request, "id", None))


def on_rejected(message: Any = None, exc: Any = None, **_: Any) -> None:
    """A message the worker rejected (or whose task is unknown) settles as an error."""
    occ = occurrence_of(getattr(message, "headers", None) or {})
    if occ is None:
        return
    _settle(current_app, occ, "error", None, f"rejected: {exc}", None, None)


def install() -> None:
    """Connect the handlers (idempotent). Importing this module already does."""
    signals.task_prerun.connect(on_prerun, weak=False, dispatch_uid=_UID + ".prerun")
    signals.task_success.connect(on_success, weak=False, dispatch_uid=_UID + ".success")
    signals.task_failure.connect(on_failure, weak=False, dispatch_uid=_UID + ".failure")
    signals.task_retry.connect(on_retry, weak=False, dispatch_uid=_UID + ".retry")
    signals.task_revoked.connect(on_revoked, weak=False, dispatch_uid=_UID + ".revoked")
    signals.task_rejected.connect(on_rejected, weak=False, dispatch_uid=_UID + ".rejected")
    signals.task_unknown.connect(on_rejected, weak=False, dispatch_uid=_UID + ".unknown")


install()
