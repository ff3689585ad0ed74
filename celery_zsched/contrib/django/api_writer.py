"""The REST API's changes in a Django deployment: the row first, Redis after its commit.

With the Django app the database row is the durable definition, and reconcile
reverts or deletes whatever exists only in Redis. So ``zsched serve`` in a
Django project (:func:`celery_zsched.cli.serve.choose_writer`) writes rows, through
the same paths as the admin and ``zsched_import --update``: a save's signal
pushes the definition on ``transaction.on_commit``, pause and resume are the
admin's actions, an import is the management command's bulk write. Every call
is its own transaction, and its on_commit callbacks have run (Redis is written)
when it returns, so the API answers with the live Redis state.

Jobs that exist only in Redis: static ``beat_schedule`` jobs may be paused and
resumed (in Redis; they have no row), never edited or deleted (the API refuses
that). A dynamic job that has no row (written to Redis before this writer was
in use) is adopted by an edit, which creates its row, and deleted in Redis by a
delete; reconcile would otherwise delete it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from django.db import IntegrityError, close_old_connections, connections, router, transaction

from celery_zsched.contrib.django import audit
from celery_zsched.contrib.django.bulk import ImportSummary, write_jobs
from celery_zsched.contrib.django.conf import get_store
from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.contrib.django.operations import apply_operation
from celery_zsched.core.audit import Actor
from celery_zsched.core.job import Job, definition_tag
from celery_zsched.core.results import ImportReport
from celery_zsched.services.writer import StoreWriter


def row_tags(row: ZSchedJob) -> set[str]:
    """The definition tags that name ``row``'s definition.

    ``enabled`` is recorded by Redis's paused set: the stored definition keeps
    the value it was last written with, so either value names the same definition.
    """
    job = row.to_job()
    return {definition_tag(dataclasses.replace(job, enabled=enabled).to_json())
            for enabled in (True, False)}


#: Rounds an import takes when concurrent creates keep taking its ids.
IMPORT_ROUNDS = 3


class ModelWriter:
    """:class:`~celery_zsched.services.writer.JobWriter` on :class:`ZSchedJob` rows."""

    def __init__(self) -> None:
        #: The database the rows are written to (the router's choice for ZSchedJob).
        self.using: str = router.db_for_write(ZSchedJob)
        # SQLite has one writer at a time, and a transaction that finds another
        # one writing fails ("database is locked") rather than wait: this
        # server's threads take turns. Other databases lock rows.
        self._turns: contextlib.AbstractContextManager[Any] = (
            threading.Lock() if connections[self.using].vendor == "sqlite"
            else contextlib.nullcontext())

    @contextlib.contextmanager
    def _orm_call(self, by: Actor) -> Iterator[None]:
        # The API calls from a pool of worker threads, which Django's request
        # cycle never visits: drop a connection the database closed or that
        # outlived CONN_MAX_AGE, before and after, as a request would.
        with self._turns:
            close_old_connections()
            try:
                with audit.acting(by):
                    yield
            finally:
                close_old_connections()

    def _redis(self) -> StoreWriter:
        return StoreWriter(get_store())

    def create(self, job: Job, by: Actor) -> bool:
        """Insert the row; ``False`` if a row or a Redis job of this id exists.

        The unique ``job_id`` decides between concurrent creates of one id:
        the loser's INSERT fails, where a check before it could pass for both.
        """
        with self._orm_call(by):
            return get_store().get_many([job.id])[0] is None and self._insert(job)

    def _insert(self, job: Job) -> bool:
        row = ZSchedJob.from_job(job)
        # Validated without the uniqueness query: the INSERT is the check.
        row.full_clean(validate_unique=False)
        try:
            with transaction.atomic(using=self.using):
                row.save(using=self.using)
        except IntegrityError:
            return False
        return True

    def replace(self, job: Job, tag: str, by: Actor) -> bool:
        """Save the row only if its definition is still the one tagged ``tag``."""
        with self._orm_call(by), transaction.atomic(using=self.using):
            row = (ZSchedJob.objects.using(self.using).select_for_update()
                   .filter(job_id=job.id).first())
            if row is None:
                return self._adopt(job, tag)
            if tag not in row_tags(row):
                return False
            row.set_definition(job)
            row.save(using=self.using)
        return True

    def _adopt(self, job: Job, tag: str) -> bool:
        # A dynamic job only in Redis: its edit creates its row (inside the
        # caller's transaction; the unique job_id stops a concurrent adoption).
        info = get_store().get_many([job.id])[0]
        return info is not None and info.tag == tag and self._insert(job)

    def delete(self, job_id: str, by: Actor) -> bool:
        """Delete the row (its signal deletes the Redis job), else the Redis-only job."""
        with self._orm_call(by):
            with transaction.atomic(using=self.using):
                deleted, _ = ZSchedJob.objects.using(self.using).filter(job_id=job_id).delete()
            return bool(deleted) or self._redis().delete(job_id, by)

    def set_paused(self, job_id: str, paused: bool, by: Actor) -> bool:
        """The admin's pause or resume action: the row's ``enabled`` (and its outbox
        entry), then the Redis state."""
        with self._orm_call(by):
            rows = ZSchedJob.objects.using(self.using).filter(job_id=job_id)
            result = apply_operation("pause" if paused else "resume", rows, by=by)
            return bool(result.rows) or self._redis().set_paused(job_id, paused, by)

    def import_jobs(self, jobs: Iterable[Job], by: Actor, note: str, *,
                    total: int) -> ImportReport:
        """``zsched_import --update``: rows in one transaction, then Redis, staggered.

        ``updated`` counts every id that existed, changed or not, as the store's
        import does. The jobs are all held (one transaction writes them).
        """
        jobs = list(jobs)
        started = time.perf_counter()
        for attempt in range(IMPORT_ROUNDS):
            summary = ImportSummary(rows=len(jobs), valid=len(jobs))
            try:
                with self._orm_call(by):
                    write_jobs(list(jobs), summary, update=True, by=by, note=note)
                break
            except IntegrityError:
                # A create of one of these ids committed between the import's
                # lookup of existing rows and its insert (its transaction rolled
                # back whole): the next round finds that row and updates it.
                if attempt == IMPORT_ROUNDS - 1:
                    raise
        redis = summary.redis or ImportReport()
        return ImportReport(total=len(jobs), created=summary.created,
                            updated=summary.updated + summary.unchanged,
                            rescheduled=redis.rescheduled,
                            seconds=time.perf_counter() - started)
