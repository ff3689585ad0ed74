"""The sweeper: a thread in every beat process that pushes the changes left in the outbox.

:func:`sweep` is one pass over the entries that are due; :class:`Sweeper`
repeats it, backing off while Redis (or the database) is unreachable, and
reports the outbox's counts to Redis; :func:`start_sweeper` runs it once per
process, on Celery's ``beat_init``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections
from django.utils import timezone as dj_timezone

from celery_zsched.contrib.django.conf import (
    DjangoSettings,
    get_defaults,
    get_django_settings,
    get_store,
)
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedOutbox
from celery_zsched.contrib.django.outbox.pushing import Change, confirm, send
from celery_zsched.contrib.django.outbox.recording import DELETE, PAUSE, RESUME, SAVE
from celery_zsched.contrib.django.outbox.state import status
from celery_zsched.contrib.django.sync import IN_CHUNK, batched
from celery_zsched.core.audit import Actor
from celery_zsched.core.errors import StoreUnavailable, ValidationError

logger = logging.getLogger("celery_zsched.django")

#: Entries one sweep reads (the next sweep follows at once when it read this many).
SWEEP_BATCH = 500
#: Longest wait before a change whose own push failed is tried again.
RETRY_MAX_S = 60.0
#: The sweeper reports its counts to Redis (for ``zsched exporter``) when they
#: change, and at least this often.
REPORT_EVERY_S = 15.0
#: A warning that the oldest pending change is too old is logged at most this often.
WARN_EVERY_S = 60.0


@dataclass
class SweepReport:
    """What one :func:`sweep` did."""

    #: Entries read, and the jobs they name.
    entries: int = 0
    jobs: int = 0
    #: Jobs Redis now holds (their entries deleted), jobs whose push failed by
    #: their own fault, and of those the ones dead-lettered now.
    pushed: int = 0
    failed: int = 0
    dead: int = 0
    #: A full batch was read: more entries may be due now.
    full: bool = False


def sweep(*, now: datetime | None = None, limit: int = SWEEP_BATCH,
          settings: DjangoSettings | None = None) -> SweepReport:
    """Push up to ``limit`` due outbox entries: each job's current row at its version.

    Cost: one query for the entries (an index over the pending ones), one for
    their rows (per 900 jobs), one versioned Redis call per action and actor,
    one DELETE per 800 confirmed jobs, and one UPDATE per failed job: O(pending),
    whatever the number of jobs. Raises :class:`StoreUnavailable` when Redis is
    unreachable; nothing is then written to the outbox.
    """
    settings = settings or get_django_settings()
    now = now or dj_timezone.now()
    report = SweepReport()
    entries = list(ZSchedOutbox.objects.filter(dead_at__isnull=True, next_try_at__lte=now)
                   .order_by("next_try_at", "id")[:limit])
    report.entries, report.full = len(entries), len(entries) >= limit
    if not entries:
        return report
    by_job: dict[str, list[ZSchedOutbox]] = defaultdict(list)
    for entry in sorted(entries, key=lambda e: e.pk):
        by_job[entry.job_id].append(entry)
    report.jobs = len(by_job)
    rows = {row.job_id: row for part in batched(by_job, IN_CHUNK)
            for row in ZSchedJob.objects.filter(job_id__in=part)}
    changes = [_change(job_id, items, rows.get(job_id)) for job_id, items in by_job.items()]
    sent = send(get_store(), changes)
    confirm(sent.done)
    report.pushed = len({c.job_id for c in sent.done})
    report.failed = len(sent.failed)
    for job_id, error in sent.failed.items():
        report.dead += _charge(by_job[job_id], error, now, settings.outbox_max_attempts)
    return report


def _change(job_id: str, entries: list[ZSchedOutbox], row: ZSchedJob | None) -> Change:
    newest = entries[-1]
    by, note = Actor(newest.actor_kind, newest.actor_name), newest.note
    top = max(entry.pk for entry in entries)
    if row is None:
        return Change(job_id, top, DELETE, by=by, note=note)
    # The row at its version holds every change recorded before it; one that the
    # package never versioned (a raw re-create) takes the entries' version.
    version = max(row.version, top)
    action = SAVE
    if all(entry.action in (PAUSE, RESUME) for entry in entries):
        action = RESUME if row.enabled else PAUSE
    try:
        job = row.to_job(get_defaults())
    except ValidationError as exc:
        return Change(job_id, version, SAVE, None, by, note, error=f"invalid row: {exc}")
    return Change(job_id, version, action, job, by, note)


def _charge(entries: list[ZSchedOutbox], error: str, now: datetime, max_attempts: int) -> int:
    """Count one failed attempt against a job's entries; 1 if that dead-letters them."""
    attempts = max(entry.attempts for entry in entries) + 1
    dead = attempts >= max_attempts
    ZSchedOutbox.objects.filter(pk__in=[entry.pk for entry in entries]).update(
        attempts=attempts, last_error=error[:2000],
        next_try_at=now + timedelta(seconds=retry_delay_s(attempts)),
        dead_at=now if dead else None)
    if dead:
        logger.error("zsched: change of job %s dead-lettered after %d attempts: %s",
                     entries[0].job_id, attempts, error)
    return int(dead)


def retry_delay_s(attempts: int) -> float:
    """Wait before the next try of a change whose push failed ``attempts`` times."""
    return float(min(RETRY_MAX_S, 2.0 ** (attempts - 1)))


def retry_dead(queryset: Any) -> int:
    """Give dead-lettered (or waiting) entries a fresh start: due now, no attempts counted."""
    count: int = queryset.update(dead_at=None, attempts=0, next_try_at=dj_timezone.now(),
                                 last_error="")
    return count



# -------------------------------------------------------------------- sweeper
class Sweeper:
    """Sweeps the outbox every ``zsched_outbox_interval_s``, backing off while Redis is down."""

    def __init__(self, settings: DjangoSettings | None = None) -> None:
        self.settings = settings or get_django_settings()
        self.failing: str | None = None
        self.backoff = self.settings.outbox_interval_s
        self._reported: tuple[int, int] | None = None
        self._reported_at = 0.0
        self._warned_at = 0.0

    def run(self, stop: threading.Event) -> None:
        """Sweep until ``stop`` is set; nothing but ``stop`` ends the loop."""
        delay = 0.0
        while not stop.wait(delay):
            try:
                delay = self.step()
            except Exception:  # a bug must not end the thread: log it, go on
                logger.exception("zsched outbox: sweep failed")
                delay = self.settings.outbox_backoff_max_s
        _close_connections()

    def step(self) -> float:
        """One sweep (and report); returns the seconds to wait before the next one."""
        try:
            if self.failing == "redis":
                get_store().now_ms()  # a cheap probe before reading the database
            report = sweep(settings=self.settings)
            self._report(idle=not report.entries)
        except StoreUnavailable as exc:
            return self._unavailable(str(exc))
        except DatabaseError as exc:
            _close_connections()  # reconnect next time
            return self._unavailable(f"database error: {exc}")
        if self.failing:
            logger.warning("zsched outbox: %s is reachable again; pending changes pushed",
                           "Redis" if self.failing == "redis" else "the database")
            self.failing, self.backoff = None, self.settings.outbox_interval_s
        return 0.0 if report.full else self.settings.outbox_interval_s

    def _unavailable(self, reason: str) -> float:
        if not self.failing:
            logger.warning("zsched outbox: cannot push pending changes (%s); trying again "
                           "every %g s at most", reason, self.settings.outbox_backoff_max_s)
            self.failing = "database" if reason.startswith("database") else "redis"
            self.backoff = self.settings.outbox_interval_s
        else:
            self.backoff = min(self.backoff * 2, self.settings.outbox_backoff_max_s)
        return self.backoff

    def _report(self, *, idle: bool = False) -> None:
        clock = time.monotonic()
        if idle and self._reported == (0, 0) and clock - self._reported_at < REPORT_EVERY_S:
            return  # nothing was pending, and the sweep found nothing: no query
        state = status()
        counts = (state.pending, state.dead)
        if counts != self._reported or clock - self._reported_at >= REPORT_EVERY_S \
                or state.pending:
            get_store().report_outbox(state.pending, state.dead,
                                      round(state.oldest_age_s * 1000))
            self._reported, self._reported_at = counts, clock
        if state.warning and clock - self._warned_at >= WARN_EVERY_S:
            logger.warning("zsched outbox: %s", state.warning)
            self._warned_at = clock


def _close_connections() -> None:
    for conn in connections.all(initialized_only=True):
        conn.close()


_lock = threading.Lock()
_thread: threading.Thread | None = None
_stop = threading.Event()


def start_sweeper(**_signal: Any) -> threading.Thread | None:
    """Start this process' sweeper thread, once (connected to beat's ``beat_init``).

    Every beat process of a Django project runs one: nothing to install or
    schedule. Several beats sweep side by side; a change pushed twice is
    applied once (versions).
    """
    global _thread
    with _lock:
        if _thread is not None and _thread.is_alive():
            return None
        _stop.clear()
        _thread = threading.Thread(target=Sweeper().run, args=(_stop,), daemon=True,
                                   name="zsched-outbox")
        _thread.start()
        logger.info("zsched outbox: sweeper started (every %g s)",
                    get_django_settings().outbox_interval_s)
        return _thread


def stop_sweeper(timeout: float = 5.0) -> None:
    """Stop the sweeper thread started by :func:`start_sweeper` (tests, shutdown)."""
    global _thread
    with _lock:
        thread, _thread = _thread, None
        _stop.set()
    if thread is not None:
        thread.join(timeout)
