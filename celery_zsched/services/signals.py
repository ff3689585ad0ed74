"""Signals about failing jobs, for projects to connect to (the built-in notifiers do).

Each is a :class:`celery.utils.dispatch.Signal` (no Django needed). A receiver
is called as ``receiver(signal=..., sender=app, event=...)``, with the Celery
app as sender and a frozen :class:`JobEvent` or :class:`BreakerEvent` as
``event``::

    from celery_zsched.services import signals

    @signals.job_dead_lettered.connect
    def page_someone(sender, event, **_):
        ...

Receivers run synchronously in the process that raised the signal (a worker
right after its settle, beat right after its reap, ``zsched serve`` after an
HTTP worker's report or its own reap), so keep them quick: a
receiver that raises is logged and never breaks the task or beat, but a slow
one delays them. The built-in notifiers only enqueue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from celery.utils.dispatch import Signal

if TYPE_CHECKING:  # store imports config, which imports this module
    from celery_zsched.core.job import Job
    from celery_zsched.core.results import SettleResult
    from celery_zsched.store import Store

logger = logging.getLogger("celery_zsched")

#: An error of a settle (every one, retried or not).
job_failed = Signal(name="job_failed")
#: An error after which the job has no retry left (it waits for its next regular run).
job_retries_exhausted = Signal(name="job_retries_exhausted")
#: An occurrence dead-lettered by beat's reap after ``zsched_max_deliveries`` crashes.
job_dead_lettered = Signal(name="job_dead_lettered")
#: A job's errors in a row reached ``zsched_notify_streak`` (once per streak).
job_failing_streak = Signal(name="job_failing_streak")
#: A domain's circuit breaker opened (closed -> open; with ``zsched_pacing``).
domain_breaker_opened = Signal(name="domain_breaker_opened")

#: Every signal, by name (the names ``zsched_notify_events`` takes).
SIGNALS: dict[str, Signal] = {
    "job_failed": job_failed, "job_retries_exhausted": job_retries_exhausted,
    "job_dead_lettered": job_dead_lettered, "job_failing_streak": job_failing_streak,
    "domain_breaker_opened": domain_breaker_opened,
}


@dataclass(frozen=True)
class JobEvent:
    """What a job signal says about the job."""

    #: The signal's name.
    event: str
    job_id: str
    #: The job's name (empty when it has none) and URL (URL jobs).
    name: str
    url: str | None
    task: str
    queue: str | None
    #: The error text (for a dead letter: the last error, or why it died).
    error: str
    occurrence: int
    attempt: int
    #: Errors in a row, this one included.
    consecutive_failures: int
    #: When it happened, epoch ms (Redis' clock for settles).
    at_ms: int

    @property
    def subject(self) -> str:
        """What the per-job rate limit counts by."""
        return f"job:{self.job_id}"

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values."""
        return asdict(self)


@dataclass(frozen=True)
class BreakerEvent:
    """A domain's breaker opened: its jobs wait until a probe succeeds."""

    event: str
    domain: str
    #: The job whose failure tipped the breaker, and its error.
    job_id: str
    error: str
    at_ms: int

    @property
    def subject(self) -> str:
        """What the rate limit counts by: one notice per domain per window."""
        return f"domain:{self.domain}"

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values."""
        return asdict(self)


Event = JobEvent | BreakerEvent


def _send(signal: Signal, sender: Any, event: Event) -> None:
    # Celery's Signal.send already logs a receiver that raises; this guards
    # the rest (a receiver list mutated mid-send, a broken logger).
    try:
        signal.send(sender=sender, event=event)
    except Exception:
        logger.exception("zsched: a receiver of %s failed", event.event)


def _job_event(name: str, job: Job | None, job_id: str, **values: Any) -> JobEvent:
    return JobEvent(event=name, job_id=job_id, name=job.name if job else "",
                    url=job.url if job else None, task=job.task if job else "",
                    queue=job.queue if job else None, **values)


def after_settle(sender: Any, job_id: str, occurrence: int, attempt: int, outcome: str,
                 error: str, result: SettleResult, streak: int) -> None:
    """Raise the signals a settle's ``result`` calls for (the worker calls this).

    Only an applied settle reports a job's failure: a stale or duplicate one
    changed nothing. A breaker opening is reported whatever the job's fate.
    """
    at = result.now_ms or int(time.time() * 1000)
    if result.breaker_opened:
        _send(domain_breaker_opened, sender, BreakerEvent(
            "domain_breaker_opened", result.breaker_opened, job_id, error, at))
    if outcome != "error" or not result.applied:
        return
    def event(name: str) -> JobEvent:
        return _job_event(name, result.job, job_id, error=error, occurrence=occurrence,
                          attempt=attempt, consecutive_failures=result.consecutive_failures,
                          at_ms=at)
    _send(job_failed, sender, event("job_failed"))
    if result.label == "error":
        _send(job_retries_exhausted, sender, event("job_retries_exhausted"))
    if streak and result.consecutive_failures == streak:
        _send(job_failing_streak, sender, event("job_failing_streak"))


def after_reap(sender: Any, store: Store, dead_ids: Sequence[str]) -> None:
    """Raise ``job_dead_lettered`` for each of ``dead_ids`` (beat calls this after a reap).

    Reads the jobs' definitions and states in one round trip, and only when a
    receiver is connected.
    """
    if not dead_ids or not job_dead_lettered.receivers:
        return
    at = int(time.time() * 1000)
    for job_id, info in zip(dead_ids, store.get_many(list(dead_ids)), strict=True):
        state = info.state if info is not None else None
        error = (f"dead-lettered after {state.crashes if state else '?'} crashed executions "
                 "(the worker died: no settle before the execution lease ran out)")
        if state is not None and state.last_error:
            error += f"; last error: {state.last_error}"
        _send(job_dead_lettered, sender, _job_event(
            "job_dead_lettered", info.job if info else None, job_id, error=error,
            occurrence=state.occurrence if state else 0, attempt=state.attempt if state else 1,
            consecutive_failures=state.consecutive_failures if state else 0, at_ms=at))
