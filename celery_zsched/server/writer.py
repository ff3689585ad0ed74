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

import os
from collections.abc import Iterable
from typing import Literal, Protocol

from celery_zsched.core.audit import Actor
from celery_zsched.core.errors import ConfigurationError, JobNotFound
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
DJANGO_APP = "celery_zsched.contrib.django"


def django_app_installed() -> bool:
    """Whether Django is configured with the celery-zsched app (set up here if need be).

    Celery's Django fixup sets ``DJANGO_SETTINGS_MODULE`` but sets Django up
    only in workers; ``zsched serve`` is not one.
    """
    try:
        import django
        from django.apps import apps
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured
    except ImportError:
        return False
    if not (settings.configured or os.environ.get("DJANGO_SETTINGS_MODULE")):
        return False
    if not apps.ready:
        try:
            django.setup()
        except (ImproperlyConfigured, ImportError) as exc:
            raise ConfigurationError(f"Django settings: {exc}") from exc
    return bool(apps.is_installed(DJANGO_APP))


def choose(store: Store, choice: WriterChoice = "auto") -> tuple[JobWriter, str]:
    """The writer of ``zsched serve`` and a line saying which one it is.

    Raises :class:`ConfigurationError` when ``django`` is asked for without the
    app, or when the app's store is not ``store`` (another key prefix): the API
    would read jobs other than those it writes.
    """
    use_django = django_app_installed() if choice != "store" else False
    if choice == "django" and not use_django:
        raise ConfigurationError(f"--writer django: Django is not configured with {DJANGO_APP} "
                                 "in INSTALLED_APPS (set DJANGO_SETTINGS_MODULE)")
    if not use_django:
        return StoreWriter(store), "REST API writes: Redis store"
    from celery_zsched.contrib.django.api_writer import ModelWriter
    from celery_zsched.contrib.django.conf import get_store

    theirs = get_store().base.prefix
    if theirs != store.base.prefix:
        raise ConfigurationError(f"the Django app's key prefix {theirs!r} is not this server's "
                                 f"{store.base.prefix!r}: give both the same zsched_key_prefix")
    writer = ModelWriter()
    return writer, f"REST API writes: Django models (db alias {writer.using})"
