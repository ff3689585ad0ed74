"""Where the management API's changes go: the Redis store, or the Django models.

Without Django, Redis is the only record of a job, and the API writes it through
the store (:class:`StoreWriter`), as the CLI does. With the Django app installed,
the database row is the durable definition, and a job that exists only in Redis is
deleted by the next reconcile: so there the API writes rows
(:class:`celery_zsched.contrib.django.api_writer.ModelWriter`), which reach Redis
as admin edits do. Either way the calls are blocking (run them in a thread), and
state operations (pause, resume, run now) are the store's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, Protocol

from celery_zsched.core.audit import Actor
from celery_zsched.core.errors import JobNotFound
from celery_zsched.core.job import Job
from celery_zsched.core.results import ImportReport
from celery_zsched.store import Store


class JobWriter(Protocol):
    """The changes the management API makes to definitions."""

    def create(self, job: Job, by: Actor) -> bool:
        """Store a new job; ``False`` (nothing written) if its id exists."""

    def replace(self, job: Job, tag: str, by: Actor) -> bool:
        """Replace a job's definition, only if it is still the one tagged ``tag``
        (:func:`~celery_zsched.core.job.definition_tag`); ``False`` (nothing written) if not."""

    def delete(self, job_id: str, by: Actor) -> bool:
        """Delete a job; ``False`` if there is none."""

    def set_paused(self, job_id: str, paused: bool, by: Actor) -> bool:
        """Pause or resume a job; ``False`` if there is none."""

    def import_jobs(self, jobs: Iterable[Job], by: Actor, note: str, *,
                    total: int) -> ImportReport:
        """Store ``total`` validated jobs (taken one at a time), staggered: new ones are
        created, existing ones updated."""


class StoreWriter:
    """Changes straight to the Redis store (no Django)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def create(self, job: Job, by: Actor) -> bool:
        return not self.store.upsert(job, by=by, expect="absent").skipped

    def replace(self, job: Job, tag: str, by: Actor) -> bool:
        return not self.store.upsert(job, by=by, expect=tag).skipped

    def delete(self, job_id: str, by: Actor) -> bool:
        try:
            self.store.delete(job_id, by=by)
        except JobNotFound:
            return False
        return True

    def set_paused(self, job_id: str, paused: bool, by: Actor) -> bool:
        try:
            (self.store.pause if paused else self.store.resume)(job_id, by=by)
        except JobNotFound:
            return False
        return True

    def import_jobs(self, jobs: Iterable[Job], by: Actor, note: str, *,
                    total: int) -> ImportReport:
        return self.store.upsert_many(jobs, stagger=True, total=total, by=by, note=note)


#: ``zsched serve --writer``: ``auto`` is Django's models when the app is installed.
WriterChoice = Literal["auto", "store", "django"]
