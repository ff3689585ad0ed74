"""The transactional outbox: a saved change of a job always reaches Redis, in order.

Every change this package makes to a :class:`ZSchedJob` row (a save or delete
through the ORM or the admin, pause and resume, ``zsched_import``, the REST API's
Django writer) records a :class:`ZSchedOutbox` entry **in the same database
transaction** (:func:`record`). The entry's id is the change's *version*: ids
only grow, and the row's ``version`` column is the id of its newest entry.

* **Fast path.** After the commit the change is pushed to Redis
  (:func:`push_after_commit`), with its version; a push that Redis confirms
  deletes the job's entries up to that version (:func:`confirm`).
* **Retries.** A push that could not reach Redis leaves its entries, and so
  does a process that died between the commit and the push. The sweeper
  (:class:`Sweeper`), a thread the app starts in every beat process
  (``beat_init``), reads the entries that are due (an index on the pending
  ones: the cost is O(pending), never O(jobs)), pushes each job's *current*
  row at its version (or its delete), and deletes what Redis confirmed. While
  Redis is unreachable it tries again after ``zsched_outbox_interval_s``,
  doubling up to ``zsched_outbox_backoff_max_s``; an outage never counts
  against a change. A change Redis refuses, or whose row is invalid, is tried
  again after 1 s, 2 s, 4 s ... (at most :data:`RETRY_MAX_S`), and after
  ``zsched_outbox_max_attempts`` failures it is dead-lettered: kept, shown in
  the admin, retried when an operator asks or when a newer change of the job
  is pushed.
* **Order.** Redis applies a versioned write only if it holds no newer version
  of the job, and a delete leaves a tombstone of its version (``upsert.lua``,
  ``control.lua``), so pushes that arrive out of order, retries and late
  pushes never move a job back nor bring a deleted one back.

Why an outbox table rather than a ``synced_version`` column on the job rows:
a delete must outlive its row, a rename is a delete of one id and a save of
another, each change carries its actor and note for the audit trail, and the
pending set stays a small table of its own (an index over a few rows), so
confirming a push never rewrites a row of a table of millions.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import redis
from django.db import DatabaseError, connections, router, transaction
from django.db.models import Count, Min, Q
from django.utils import timezone as dj_timezone

from celery_zsched.contrib.django.conf import (
    DjangoSettings,
    get_defaults,
    get_django_settings,
    get_store,
)
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedOutbox
from celery_zsched.contrib.django.sync import IN_CHUNK, batched
from celery_zsched.core.audit import Actor
from celery_zsched.core.errors import StoreUnavailable, ValidationError
from celery_zsched.core.job import Job
from celery_zsched.store import Store

logger = logging.getLogger("celery_zsched.django")

#: Entries one sweep reads (the next sweep follows at once when it read this many).
SWEEP_BATCH = 500
#: Longest wait before a change whose own push failed is tried again.
RETRY_MAX_S = 60.0
#: Bound parameters per DELETE of confirmed entries (well under SQLite's 999).
CONFIRM_PARAMS = 800
#: The sweeper reports its counts to Redis (for ``zsched exporter``) when they
#: change, and at least this often.
REPORT_EVERY_S = 15.0
#: A warning that the oldest pending change is too old is logged at most this often.
WARN_EVERY_S = 60.0

#: The actions of :class:`~.models.SyncAction`.
SAVE, DELETE, PAUSE, RESUME = "save", "delete", "pause", "resume"


# ------------------------------------------------------------------ recording
def record(job_ids: Sequence[str], action: str, *, using: str, by: Actor, note: str = "",
           columns: dict[str, Any] | None = None) -> int:
    """Record a change of each of ``job_ids`` in the outbox; returns its version.

    Call it inside the transaction that changes the rows, once it holds their
    locks (it wrote them, or selected them ``FOR UPDATE``): a later change of
    the same job then gets a larger version. Every row but a deleted one gets
    the version in its ``version`` column, and ``columns`` in the same UPDATE.
    One INSERT (``executemany``) and one UPDATE per 900 rows, whatever the action.
    """
    if not job_ids:
        return 0
    with transaction.atomic(using=using, savepoint=False):
        version = _insert_entries(job_ids, action, using, by, note)
        if action != DELETE:
            for part in batched(job_ids, IN_CHUNK):
                ZSchedJob.objects.using(using).filter(job_id__in=part).update(
                    version=version, **(columns or {}))
    return version


#: The columns an entry is written with (``id`` and ``dead_at`` take their defaults).
_ENTRY_COLUMNS = ("job_id", "action", "actor_kind", "actor_name", "note", "created_at",
                  "attempts", "next_try_at", "last_error")


def _insert_entries(job_ids: Sequence[str], action: str, using: str, by: Actor,
                    note: str) -> int:
    """INSERT one entry per job (one ``executemany``); the version: the last entry's id.

    A parametrised statement rather than ``bulk_create``, whose per-value
    compilation cost 1 s for 10,000 entries. Ids grow within a connection's
    inserts, so the last job's newest entry is the newest of this change (a
    later one of that job would need the row lock this transaction holds).
    """
    meta = ZSchedOutbox._meta
    connection = connections[using]
    quote = connection.ops.quote_name
    now = dj_timezone.now()
    values = {"action": action, "actor_kind": by.kind, "actor_name": by.name, "note": note,
              "created_at": now, "attempts": 0, "next_try_at": now, "last_error": ""}
    fixed = [meta.get_field(name).get_db_prep_save(values[name], connection)
             for name in _ENTRY_COLUMNS[1:]]
    table, key, job = quote(meta.db_table), quote(meta.pk.column), quote("job_id")
    columns = ", ".join(quote(meta.get_field(name).column) for name in _ENTRY_COLUMNS)
    marks = ", ".join(["%s"] * len(_ENTRY_COLUMNS))
    with connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})",
                           [[job_id, *fixed] for job_id in job_ids])
        cursor.execute(f"SELECT MAX({key}) FROM {table} WHERE {job} = %s", [job_ids[-1]])
        row = cursor.fetchone()
    return int(row[0])


def write_rows(job_ids: Sequence[str], columns: dict[str, Any], action: str, *, using: str,
               by: Actor, note: str = "") -> tuple[list[str], int]:
    """Set ``columns`` on the rows of ``job_ids`` that differ, and record the change.

    In one transaction: the rows that differ are selected ``FOR UPDATE`` (900
    at a time), then updated, version and columns in one UPDATE per 900 rows.
    Returns the ids whose rows changed and the change's version (0 if none did).
    """
    changed: list[str] = []
    with transaction.atomic(using=using, savepoint=False):
        for part in batched(job_ids, IN_CHUNK):
            changed += ZSchedJob.objects.using(using).filter(job_id__in=part) \
                .exclude(**columns).select_for_update().values_list("job_id", flat=True)
        version = record(changed, action, using=using, by=by, note=note, columns=columns)
    return changed, version


# -------------------------------------------------------------------- pushing
@dataclass(frozen=True)
class Change:
    """What Redis must hold for one job, at one version.

    ``save`` writes ``job`` (``None``: the row is invalid, so the change waits
    in the outbox, where failed attempts are counted); ``pause`` and ``resume``
    change only the paused state (``job``, when known, creates the job if
    Redis does not have it); ``delete`` leaves a tombstone.
    """

    job_id: str
    version: int
    action: str
    job: Job | None = None
    by: Actor = field(default_factory=Actor)
    note: str = ""
    #: Why ``job`` is missing (an invalid row), for the entry's last error.
    error: str = ""


@dataclass
class Sent:
    """What :func:`send` achieved: jobs Redis now holds, and jobs that failed by their fault."""

    done: list[Change] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def send(store: Store, changes: Sequence[Change]) -> Sent:
    """Push ``changes`` to Redis, versioned: one call per action and actor, not per job.

    A change that Redis holds a newer version of counts as done: the newer one
    is what counts. A job a pause or resume did not find in Redis is created
    from its definition when the change carries one, else left pending. Raises
    :class:`StoreUnavailable` when Redis cannot be reached (nothing is then
    counted against any change).
    """
    sent = Sent()
    groups: dict[tuple[str, Actor, str], list[Change]] = defaultdict(list)
    for change in changes:
        if change.action == SAVE and change.job is None:
            sent.failed[change.job_id] = change.error or "the row is invalid"
        else:
            groups[(change.action, change.by, change.note)].append(change)
    for (action, by, note), group in groups.items():
        try:
            _send_group(store, action, by, note, group, sent)
        except redis.ResponseError as exc:
            if isinstance(exc, redis.exceptions.OutOfMemoryError) \
                    or str(exc).startswith("BUSY"):
                # Redis as a whole refuses for now (out of memory, a busy script):
                # an outage, never a change's fault.
                raise StoreUnavailable(f"Redis refuses writes for now: {exc}") from exc
            if len(group) == 1:
                sent.failed[group[0].job_id] = f"Redis refused it: {exc}"
                continue
            for change in group:  # find the one(s) at fault
                one = send(store, [change])
                sent.done += one.done
                sent.failed.update(one.failed)
    return sent


def _send_group(store: Store, action: str, by: Actor, note: str, group: list[Change],
                sent: Sent) -> None:
    versions = {c.job_id: c.version for c in group}
    if action == SAVE:
        jobs = [c.job for c in group if c.job is not None]
        store.upsert_many(jobs, stagger=True, by=by, note=note, versions=versions)
        sent.done += group
        return
    reply = store.control(action, [c.job_id for c in group], versions=versions, by=by,
                          note=note)
    missing = set(reply.missing) if action != DELETE else set()
    create = [c for c in group if c.job_id in missing and c.job is not None]
    if create:
        store.upsert_many([c.job for c in create if c.job is not None], stagger=True, by=by,
                          note=note, versions={c.job_id: c.version for c in create})
    sent.done += [c for c in group if c.job_id not in missing or c.job is not None]


def confirm(changes: Iterable[Change], using: str | None = None) -> int:
    """Delete the outbox entries Redis now holds: each job's, up to its pushed version.

    Dead-lettered entries of the job go too: the pushed version supersedes
    them. Changes of one version share one ``job_id IN (...)`` statement, so a
    bulk change of 100,000 rows costs one DELETE per 800 of them.
    """
    latest: dict[str, int] = {}
    for change in changes:
        latest[change.job_id] = max(latest.get(change.job_id, 0), change.version)
    by_version: dict[int, list[str]] = defaultdict(list)
    for job_id, version in latest.items():
        by_version[version].append(job_id)
    deleted, terms, params = 0, Q(), 0
    manager = ZSchedOutbox.objects.using(using or router.db_for_write(ZSchedOutbox))
    for version, ids in by_version.items():
        for part in batched(ids, CONFIRM_PARAMS):
            terms |= Q(id__lte=version, job_id__in=part)
            params += len(part) + 1
            if params >= CONFIRM_PARAMS:
                deleted += manager.filter(terms).delete()[0]
                terms, params = Q(), 0
    if params:
        deleted += manager.filter(terms).delete()[0]
    return deleted


def push(changes: Sequence[Change], using: str | None = None) -> bool:
    """Send ``changes`` now and confirm what Redis took; False if any is left to the sweeper.

    Failures are logged, never raised: the changes are saved, and their outbox
    entries stay until the sweeper in beat delivers them.
    """
    try:
        sent = send(get_store(), changes)
    except StoreUnavailable as exc:
        logger.warning("zsched: Redis not updated for job %s (%s); the change is kept in the "
                       "outbox and retried by beat as soon as Redis is reachable",
                       changes[0].job_id if changes else "-", exc)
        return False
    try:
        confirm(sent.done, using)
    except DatabaseError as exc:  # Redis has it: a sweep will find it there and confirm it
        logger.warning("zsched: could not confirm %d pushed change(s): %s", len(sent.done), exc)
    for job_id, error in list(sent.failed.items())[:5]:
        logger.error("zsched: job %s not sent to Redis (%s); kept in the outbox", job_id, error)
    return not sent.failed and len(sent.done) == len(changes)


def push_after_commit(changes: Sequence[Change], *, using: str) -> None:
    """Push ``changes`` when the current transaction commits (at once outside of one)."""
    if changes:
        transaction.on_commit(functools.partial(push, list(changes), using), using=using)


# ------------------------------------------------------------------- sweeping
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


# --------------------------------------------------------------------- status
@dataclass(frozen=True)
class OutboxStatus:
    """How the outbox stands: pending and dead-lettered changes, and the oldest pending one."""

    pending: int
    dead: int
    oldest_age_s: float
    #: ``zsched_outbox_warn_s``: the oldest pending change is older than this.
    warn_s: float

    @property
    def late(self) -> bool:
        """The oldest pending change is older than ``zsched_outbox_warn_s``."""
        return self.pending > 0 and self.oldest_age_s > self.warn_s

    @property
    def warning(self) -> str:
        """What to tell an operator ("" when all is well)."""
        parts = []
        if self.late:
            parts.append(f"the oldest of {self.pending} change(s) saved in the database is not "
                         f"in Redis after {self.oldest_age_s:.0f} s (over zsched_outbox_warn_s ="
                         f" {self.warn_s:g} s): is Redis reachable, and is beat running?")
        if self.dead:
            parts.append(f"{self.dead} change(s) failed zsched_outbox_max_attempts times and "
                         "are dead-lettered: see 'Changes not yet in Redis' in the admin")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``zsched_stats --json``)."""
        return {"pending": self.pending, "dead": self.dead,
                "oldest_age_s": round(self.oldest_age_s, 3), "warn_s": self.warn_s,
                "warning": self.warning}


def status(now: datetime | None = None) -> OutboxStatus:
    """Count the outbox (one query over its pending and dead entries, never the jobs)."""
    now = now or dj_timezone.now()
    pending_q = Q(dead_at__isnull=True)
    agg = ZSchedOutbox.objects.aggregate(
        pending=Count("pk", filter=pending_q), dead=Count("pk", filter=~pending_q),
        oldest=Min("created_at", filter=pending_q))
    oldest = agg["oldest"]
    age = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
    return OutboxStatus(int(agg["pending"] or 0), int(agg["dead"] or 0), age,
                        get_django_settings().outbox_warn_s)


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
