"""Bulk import into the database (then Redis, staggered) and export from the database.

The file formats, validation and line numbers are :mod:`celery_zsched.core.formats`'s,
shared with ``celery zsched import``; this module adds the database, which is
written first (one transaction) because the row is the durable definition.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from django.db import connections, router, transaction
from django.utils import timezone as dj_timezone

from celery_zsched.contrib.django import outbox
from celery_zsched.contrib.django.conf import get_defaults, get_store
from celery_zsched.contrib.django.models import DEFINITION_FIELDS, ZSchedJob
from celery_zsched.contrib.django.progress import Progress
from celery_zsched.contrib.django.sync import IN_CHUNK, SAMPLES, batched, chunked_rows, existing_ids
from celery_zsched.core.audit import API, Actor
from celery_zsched.core.errors import ValidationError
from celery_zsched.core.formats import read_rows
from celery_zsched.core.job import Job
from celery_zsched.core.rows import import_actor, parse_rows, write_rows
from celery_zsched.store import ImportReport

#: Rows per ``bulk_create`` / ``bulk_update`` call (the backend may split further).
DB_BATCH = 2000


@dataclass
class ImportSummary:
    """What :func:`import_jobs` did (or, with ``dry_run``, would do)."""

    dry_run: bool = False
    #: Rows in the file, and valid ones.
    rows: int = 0
    valid: int = 0
    #: Rows left out with ``skip_invalid``: each error names its field and line.
    invalid: list[ValidationError] = field(default_factory=list)
    #: New rows created; existing rows updated or already equal (``update``), or
    #: skipped (without it).
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped_existing: int = 0
    skipped_ids: list[str] = field(default_factory=list)
    #: What the Redis upsert did (``None`` for a dry run or when nothing was written).
    redis: ImportReport | None = None
    #: Seconds per phase: read, validate, db, redis.
    timings: dict[str, float] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """Human-readable summary."""
        verb = "would " if self.dry_run else ""
        out = [
            f"rows: {self.rows}, valid: {self.valid}, invalid (skipped): {len(self.invalid)}",
            f"{verb}create: {self.created}",
            f"{verb}update: {self.updated} (unchanged: {self.unchanged})",
            f"existing ids skipped (use --update to update them): {self.skipped_existing}"
            if self.skipped_existing else "existing ids skipped: 0",
        ]
        if self.skipped_ids:
            out.append("  e.g. " + ", ".join(self.skipped_ids))
        out += [f"  {error}" for error in self.invalid[:50]]
        if len(self.invalid) > 50:
            out.append(f"  ... and {len(self.invalid) - 50} more")
        if self.redis is not None:
            out.append(f"Redis: {self.redis.created} created, {self.redis.updated} updated, "
                       f"{self.redis.rescheduled} rescheduled")
        out.append("took " + ", ".join(f"{k} {v:.2f}s" for k, v in self.timings.items()))
        return out


def import_jobs(path: str | Path, fmt: str | None = None, *, dry_run: bool = False,
                update: bool = False, skip_invalid: bool = False,
                progress: Progress | None = None) -> ImportSummary:
    """Import a JSON, JSON Lines or CSV file of jobs into the database, then Redis.

    Every row is validated before anything is written. Any invalid row raises
    :class:`~celery_zsched.core.errors.ImportValidationError` listing each bad row's
    field and line, and nothing is written; with ``skip_invalid`` the valid rows
    are imported and the others reported. New ids are created with
    ``bulk_create``; ids already in the database are skipped, or with
    ``update`` overwritten (their schedule only moves if their timing
    changed). All database writes are one transaction. Then the written jobs
    are upserted into Redis, first runs staggered over their intervals.

    A file that cannot be read raises :class:`~celery_zsched.core.errors.ValidationError`.
    If Redis is down after the database commit,
    :class:`~celery_zsched.core.errors.StoreUnavailable` is raised: the rows are
    saved with their outbox entries, and beat's outbox sweeper pushes them
    (staggered) as soon as Redis is reachable.
    """
    progress = progress or Progress(io.StringIO(), enabled=False)
    summary = ImportSummary(dry_run=dry_run)
    clock = time.perf_counter()

    rows = read_rows(path, fmt)
    summary.rows = len(rows)
    summary.timings["read"] = _lap(clock)

    clock = time.perf_counter()
    result = parse_rows(rows, get_defaults(), skip_invalid=skip_invalid)
    del rows
    summary.valid, summary.invalid = len(result.jobs), result.errors
    write_jobs(result.jobs, summary, update=update, progress=progress, by=import_actor(path),
               started=clock)
    return summary


def write_jobs(jobs: list[Job], summary: ImportSummary, *, update: bool,
               progress: Progress | None = None, by: Actor | None = None, note: str = "",
               started: float | None = None) -> None:
    """Write validated ``jobs`` into the database (one transaction), then Redis, staggered.

    The second half of :func:`import_jobs`, shared with the REST API's import
    (:class:`.api_writer.ModelWriter`): ``summary`` gets the counts and timings
    (``summary.dry_run`` writes nothing). The Redis changes are recorded as made
    ``by``, with ``note``.
    """
    progress = progress or Progress(io.StringIO(), enabled=False)
    clock = time.perf_counter() if started is None else started
    dry_run = summary.dry_run
    known = existing_ids(job.id for job in jobs)
    fresh = [job for job in jobs if job.id not in known]
    existing = [job for job in jobs if job.id in known]
    summary.created = len(fresh)
    if not update:
        summary.skipped_existing = len(existing)
        summary.skipped_ids = [job.id for job in existing[:SAMPLES]]
    summary.timings["validate"] = _lap(clock)
    if dry_run:
        if update and existing:
            summary.updated = len(_update(existing, progress, dry_run=True)[0])
            summary.unchanged = len(existing) - summary.updated
        progress.finish()
        return

    clock = time.perf_counter()
    by = by or API
    using = router.db_for_write(ZSchedJob)
    versions: dict[str, int] = {}
    with transaction.atomic(using=using):
        _create(fresh, progress)
        if update and existing:
            changed_ids, versions = _update(existing, progress)
            summary.updated = len(changed_ids)
            summary.unchanged = len(existing) - summary.updated
        else:
            changed_ids = []
        # In the rows' transaction: every written row reaches Redis, now or from the
        # outbox's sweeper if Redis fails below.
        recorded = [job.id for job in fresh] + changed_ids
        version = outbox.record(recorded, outbox.SAVE, using=using, by=by, note=note)
        versions.update(dict.fromkeys(recorded, version))
    progress.finish()
    summary.timings["db"] = _lap(clock)

    # With update, unchanged jobs are upserted too (a no-op for Redis when
    # they are there, a repair when they are not), each at its row's version.
    written = fresh + existing if update else fresh
    if written:
        clock = time.perf_counter()
        progress.start("redis", len(written))
        summary.redis = get_store().upsert_many(written, stagger=True, total=len(written),
                                                progress=progress.update,
                                                by=by, note=note, versions=versions)
        outbox.confirm((outbox.Change(job_id, version, outbox.SAVE) for job_id in recorded),
                       using)
        progress.finish()
        summary.timings["redis"] = _lap(clock)


def _lap(started: float) -> float:
    return round(time.perf_counter() - started, 3)


def _create(jobs: list[Job], progress: Progress) -> None:
    progress.start("database", len(jobs))
    for part in batched(jobs, DB_BATCH):
        # bulk_create sends no signals: Redis is written once, in bulk, after.
        ZSchedJob.objects.bulk_create([ZSchedJob.from_job(job) for job in part])
        progress.advance(len(part))


def _update(jobs: list[Job], progress: Progress, *, dry_run: bool = False
            ) -> tuple[list[str], dict[str, int]]:
    """Overwrite the definitions of existing rows: the ids that changed, and the
    versions of the rows that did not (to push them at their own version).

    Rows whose definition is already equal are not written, so re-importing a
    file costs reads only. Changed rows are written with one parametrised
    ``UPDATE`` per row through ``executemany``: ``bulk_update`` builds
    ``CASE WHEN`` statements whose cost grows with the batch, and took over
    ten minutes for 100,000 rows on SQLite, against seconds this way.
    """
    progress.start("update", len(jobs))
    now = dj_timezone.now()
    changed: list[str] = []
    unchanged: dict[str, int] = {}
    pending: list[ZSchedJob] = []
    for part in batched(jobs, IN_CHUNK):
        by_id = {job.id: job for job in part}
        for row in ZSchedJob.objects.filter(job_id__in=list(by_id)):
            before = row.definition_values()
            row.set_definition(by_id[row.job_id])
            if row.definition_values() != before:
                row.updated_at = now
                pending.append(row)
            else:
                unchanged[row.job_id] = row.version
        changed += [row.job_id for row in pending]
        if not dry_run and pending:
            _write_definitions(pending)
        pending = []
        progress.advance(len(part))
    return changed, unchanged


def _write_definitions(rows: list[ZSchedJob]) -> None:
    meta = ZSchedJob._meta
    fields = [meta.get_field(name) for name in (*DEFINITION_FIELDS, "kind", "updated_at")]
    connection = connections[router.db_for_write(ZSchedJob)]
    quote = connection.ops.quote_name
    columns = ", ".join(f"{quote(f.column)} = %s" for f in fields)
    sql = f"UPDATE {quote(meta.db_table)} SET {columns} WHERE {quote(meta.pk.column)} = %s"
    # get_db_prep_save adapts each value exactly as the ORM would (JSON, datetimes).
    params = [[f.get_db_prep_save(getattr(row, f.attname), connection)
               for f in fields] + [row.pk] for row in rows]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def export_jobs(fp: TextIO, fmt: str, *, invalid: list[str] | None = None) -> int:
    """Write every database job to ``fp`` as ``json``, ``jsonl`` or ``csv``; returns the count.

    Streams the table in chunks. The output re-imports (``zsched_import``) to
    the same definitions. Rows that fail validation are left out and listed in
    ``invalid``.
    """
    defaults = get_defaults()

    def jobs() -> Iterator[Job]:
        for rows in chunked_rows(ZSchedJob.objects.all()):
            for row in rows:
                try:
                    yield row.to_job(defaults)
                except ValidationError as exc:
                    if invalid is not None:
                        invalid.append(f"{row.job_id or row.pk}: {exc}")

    return write_rows(jobs(), fp, fmt)
