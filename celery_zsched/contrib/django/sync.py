"""Keep Redis in line with the database: bulk reconcile, the safety net.

The database row is the durable definition. Every change this package makes
reaches Redis through the outbox (:mod:`.outbox`): pushed after the commit, or
by the sweeper in beat when Redis was unreachable then, so a Redis blip needs
no reconcile. :func:`reconcile` repairs what the outbox cannot know: a Redis
that lost its data (a flush, a restart without persistence, a failover that
lost writes), and rows written around this package (queryset ``update()``,
``bulk_create()`` or raw SQL of your own).
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db.models import QuerySet

from celery_zsched.contrib.django.conf import get_defaults, get_store
from celery_zsched.contrib.django.models import MIRROR_FIELDS, ZSchedJob
from celery_zsched.contrib.django.progress import Progress
from celery_zsched.core.audit import Actor, local_user
from celery_zsched.core.errors import JobNotFound, ValidationError
from celery_zsched.core.job import Defaults, Job
from celery_zsched.store import Store

logger = logging.getLogger("celery_zsched.django")

#: Rows per database query and per Redis round trip in bulk operations.
CHUNK = 2000
#: Most values in one SQL ``IN (...)``: below SQLite's historic limit of 999.
IN_CHUNK = 900
#: Ids kept per category in a report, to show what a dry run would do.
SAMPLES = 20


# ------------------------------------------------------------------ helpers
def chunked_rows(queryset: QuerySet[ZSchedJob], size: int = CHUNK
                 ) -> Iterator[list[ZSchedJob]]:
    """Rows of ``queryset`` in primary-key order, ``size`` at a time, in constant memory.

    Keyset pagination (``pk > last``) rather than one long ``iterator()``
    cursor: each chunk is its own short query, so writing between chunks is
    safe on every backend (SQLite's open cursors and PostgreSQL's server-side
    cursors both dislike that) and no transaction is held open for the scan.
    """
    last = None
    while True:
        page = queryset.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        rows = list(page[:size])
        if not rows:
            return
        yield rows
        last = rows[-1].pk


def batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """Lists of at most ``size`` consecutive items."""
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def existing_ids(ids: Iterable[str]) -> set[str]:
    """Which of ``ids`` have a :class:`ZSchedJob` row (one query per 900 ids)."""
    found: set[str] = set()
    for part in batched(ids, IN_CHUNK):
        found.update(ZSchedJob.objects.filter(job_id__in=part)
                     .values_list("job_id", flat=True))
    return found


def valid_jobs(rows: Iterable[ZSchedJob], defaults: Defaults,
               invalid: list[str] | None = None) -> Iterator[tuple[ZSchedJob, Job]]:
    """``(row, job)`` for each row that validates; others are noted in ``invalid``."""
    for row in rows:
        try:
            yield row, row.to_job(defaults)
        except ValidationError as exc:
            if invalid is not None:
                invalid.append(f"{row.job_id or row.pk}: {exc}")


def reconcile_actor() -> Actor:
    """Who reconcile's changes are recorded as made by: ``zsched_sync`` or its task,
    run by this process' user."""
    return Actor("reconcile", local_user())


# ---------------------------------------------------------------- pushing rows
def _delete(store: Store, job_ids: Sequence[str], *, by: Actor | None = None,
            note: str = "") -> int:
    try:
        return store.delete(*job_ids, by=by, note=note)
    except JobNotFound:  # one id that Redis never had: already as wanted
        return 0


def push_pks(pks: Sequence[int], *, stagger: bool = True,
             progress: Callable[[int], None] | None = None, by: Actor | None = None) -> int:
    """Upsert the definitions of rows named by primary key, streamed; returns the count.

    Rows are read 900 at a time; first runs of new jobs are staggered over all
    of them. Each is pushed at its ``version``. Invalid rows are skipped (and logged). Raises
    :class:`~celery_zsched.core.errors.StoreUnavailable` if Redis is down.
    """
    defaults = get_defaults()
    invalid: list[str] = []
    # Each row at its version (filled in as the rows stream by): a change made
    # meanwhile, already pushed with a newer version, is not undone.
    versions: dict[str, int] = {}

    def jobs() -> Iterator[Job]:
        for part in batched(pks, IN_CHUNK):
            rows = ZSchedJob.objects.filter(pk__in=part).order_by("pk")
            for row, job in valid_jobs(rows, defaults, invalid):
                versions[job.id] = row.version
                yield job

    report = get_store().upsert_many(jobs(), stagger=stagger, total=len(pks),
                                     progress=progress, by=by, versions=versions)
    for line in invalid[:SAMPLES]:
        logger.error("zsched: invalid job not sent to Redis: %s", line)
    return report.created + report.updated


# ------------------------------------------------------------------ reconcile
@dataclass
class ReconcileReport:
    """What :func:`reconcile` did (or, with ``dry_run``, would do)."""

    dry_run: bool = False
    #: Rows in the database, and definitions found in Redis.
    db_jobs: int = 0
    redis_jobs: int = 0
    #: Rows missing from Redis: upserted, first runs staggered.
    missing: int = 0
    #: Rows whose Redis definition differed: updated (schedule kept unless timing changed).
    changed: int = 0
    unchanged: int = 0
    #: Dynamic Redis jobs with no row: deleted. Static ``beat_schedule`` jobs are kept.
    deleted: int = 0
    static_kept: int = 0
    #: Rows whose runtime mirror was refreshed from Redis.
    mirrored: int = 0
    #: Rows that fail validation (left alone in Redis), as "id: error".
    invalid: list[str] = field(default_factory=list)
    #: A few ids per category (missing, changed, deleted), for a dry run's output.
    samples: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0

    def note(self, category: str, job_id: str) -> None:
        """Keep ``job_id`` as an example of ``category``."""
        ids = self.samples.setdefault(category, [])
        if len(ids) < SAMPLES:
            ids.append(job_id)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (a Celery task's result)."""
        return asdict(self)

    def lines(self) -> list[str]:
        """Human-readable summary, one fact per line."""
        verb = "would " if self.dry_run else ""
        out = [
            f"database jobs: {self.db_jobs}, Redis definitions: {self.redis_jobs}",
            f"{verb}add to Redis (staggered): {self.missing}",
            f"{verb}update in Redis: {self.changed}",
            f"unchanged: {self.unchanged}",
            f"{verb}delete from Redis (no row): {self.deleted}",
            f"static beat_schedule jobs kept: {self.static_kept}",
            f"{verb}refresh runtime mirror of: {self.mirrored}",
            f"invalid rows (left alone): {len(self.invalid)}",
        ]
        for category, ids in self.samples.items():
            out.append(f"  {category}: {', '.join(ids)}")
        out += [f"  invalid {line}" for line in self.invalid[:SAMPLES]]
        out.append(f"took {self.seconds:.2f}s")
        return out


def reconcile(*, dry_run: bool = False, prune: bool = True, chunk_size: int = CHUNK,
              progress: Progress | None = None) -> ReconcileReport:
    """Make Redis match the database, and the runtime mirror match Redis.

    1. Rows are compared with Redis ``chunk_size`` at a time (one query and
       one pipelined Redis round trip per chunk, never one per job). The
       runtime mirror of each row is refreshed from its Redis state
       (``bulk_update``).
    2. Rows missing from Redis, or whose definition differs, are upserted in
       one staggered :meth:`Store.upsert_many` over all of them: after Redis
       lost its data, first runs spread evenly over each interval instead of
       all firing now. Existing schedules are kept unless the timing changed.
    3. With ``prune``, dynamic Redis jobs that have no row are deleted. Jobs
       from the static ``beat_schedule`` setting are never deleted.

    This is how changes made around this package reach Redis (queryset
    ``update()``, ``bulk_create()``, raw SQL of your own), and how Redis is
    rebuilt after it lost its data. A Redis that was only unreachable needs
    none: the outbox delivers every change. With ``dry_run`` nothing is
    written, to Redis or the database; the report tells what would change.
    Memory holds one chunk plus the primary keys of the rows to push.
    Raises :class:`~celery_zsched.core.errors.StoreUnavailable` if Redis is down.
    """
    started = time.perf_counter()
    report = ReconcileReport(dry_run=dry_run)
    store, defaults = get_store(), get_defaults()
    progress = progress or Progress(io.StringIO(), enabled=False)
    progress.start("compare", ZSchedJob.objects.count())
    to_push: list[int] = []
    for rows in chunked_rows(ZSchedJob.objects.all(), chunk_size):
        _compare_chunk(store, rows, defaults, report, to_push)
        progress.advance(len(rows))
    if to_push and not dry_run:
        progress.start("redis", len(to_push))
        push_pks(to_push, progress=progress.update, by=reconcile_actor())
    progress.finish()
    _prune_unknown(store, report, prune=prune, chunk_size=chunk_size)
    report.seconds = time.perf_counter() - started
    return report


def _compare_chunk(store: Store, rows: list[ZSchedJob], defaults: Defaults,
                   report: ReconcileReport, to_push: list[int]) -> None:
    report.db_jobs += len(rows)
    pairs = list(valid_jobs(rows, defaults, report.invalid))
    infos = store.get_many([job.id for _row, job in pairs])
    mirrored: list[ZSchedJob] = []
    for (row, job), info in zip(pairs, infos, strict=True):
        if info is None:
            report.missing += 1
            report.note("missing", job.id)
            to_push.append(row.pk)
            continue
        if info.job.to_json() != job.to_json():
            report.changed += 1
            report.note("changed", job.id)
            to_push.append(row.pk)
        else:
            report.unchanged += 1
        if row.apply_state(info.state):
            mirrored.append(row)
    report.mirrored += len(mirrored)
    if mirrored and not report.dry_run:
        # Only the mirror columns: a concurrent edit of the definition is kept,
        # and bulk_update sends no signal, so this never loops back to Redis.
        ZSchedJob.objects.bulk_update(mirrored, MIRROR_FIELDS, batch_size=500)


def _prune_unknown(store: Store, report: ReconcileReport, *, prune: bool,
                   chunk_size: int) -> None:
    static = store.static_ids()
    doomed: list[str] = []
    # HSCAN (iter_jobs): constant memory; the DB is asked per chunk, at scan
    # time, so a row committed during the scan is never taken for unknown.
    scan = (job.id for job in store.iter_jobs(count=chunk_size))
    for part in batched(scan, chunk_size):
        report.redis_jobs += len(part)
        known = existing_ids(part)
        for job_id in part:
            if job_id in known:
                continue
            if job_id in static:
                report.static_kept += 1
            elif prune:
                doomed.append(job_id)
                report.note("deleted", job_id)
    report.deleted = len(doomed)
    if doomed and not report.dry_run:
        for part in batched(doomed, 10 * CHUNK):
            _delete(store, part, by=reconcile_actor())
