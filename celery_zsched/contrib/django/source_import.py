"""Move another scheduler's entries into the database, then Redis (``zsched_import --from``).

The rows are written first (one transaction, no signals) because the row is
the durable definition; then Redis gets the jobs it lacks or holds differently,
each first due when its source would have run it next. Running it again
compares both sides and writes nothing that is already equal.
"""

from __future__ import annotations

import io

from django.db import router, transaction

from celery_zsched.contrib.django import outbox
from celery_zsched.contrib.django.bulk import _create, _update
from celery_zsched.contrib.django.conf import get_defaults, get_store
from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.contrib.django.progress import Progress
from celery_zsched.contrib.django.sync import existing_ids
from celery_zsched.core.errors import ValidationError
from celery_zsched.services.sources import (
    DJANGO_CELERY_BEAT,
    REDBEAT,
    REDBEAT_DEFAULT_PREFIX,
    SourceRead,
    SwitchPlan,
    check_errors,
    entry_error,
    plan_against_store,
    read_redbeat,
    redbeat_client,
    source_actor,
)

#: ``--from`` values of ``zsched_import``.
SOURCES = (DJANGO_CELERY_BEAT, REDBEAT)
#: Job fields stored in a length-limited column.
_COLUMNS = ("name", "task", "cron", "timezone", "queue", "routing_key")


def read_source(source: str, *, redbeat_prefix: str | None = None,
                redbeat_url: str | None = None) -> SourceRead:
    """Read ``source`` (one of :data:`SOURCES`) with this project's defaults."""
    defaults = get_defaults()
    if source == DJANGO_CELERY_BEAT:
        from celery_zsched.contrib.django.dcb_source import read_periodic_tasks

        return read_periodic_tasks(defaults)
    if source == REDBEAT:
        from celery import current_app
        from django.conf import settings

        prefix = redbeat_prefix or getattr(settings, "CELERY_REDBEAT_KEY_PREFIX", None)
        # redbeat stores crontabs without a zone and runs them in the app's:
        # CELERY_TIMEZONE, read here too in case manage.py never loaded the app.
        zone = getattr(settings, "CELERY_TIMEZONE", None) or current_app.timezone
        return read_redbeat(redbeat_client(redbeat_url, get_store()), defaults,
                            prefix=prefix or REDBEAT_DEFAULT_PREFIX, timezone=str(zone))
    raise ValueError(f"unknown source {source!r}; expected one of {', '.join(SOURCES)}")


def _fit_columns(read: SourceRead) -> None:
    """Move the jobs whose values do not fit the model's columns to the errors."""
    kept = []
    for item in read.jobs:
        for name in _COLUMNS:
            value = getattr(item.job, name) or ""
            limit = ZSchedJob._meta.get_field(name).max_length
            if len(value) > limit:
                read.errors.append(entry_error(
                    f"{read.source} entry {item.source_name!r}",
                    ValidationError(name, value, f"is longer than {limit} characters")))
                break
        else:
            kept.append(item)
    read.jobs = kept


def import_source(read: SourceRead, *, dry_run: bool = False, skip_invalid: bool = False,
                  progress: Progress | None = None) -> SwitchPlan:
    """Write ``read``'s jobs as rows (created, or updated when different), then Redis.

    An entry that cannot be moved raises
    :class:`~celery_zsched.core.errors.ImportValidationError` before anything is
    written, unless ``skip_invalid`` leaves it out. ``dry_run`` reports and
    writes nothing. Redis is read before the database is written; if it fails
    after the commit, :class:`~celery_zsched.core.errors.StoreUnavailable`
    propagates, and running the import again completes Redis with the same
    first runs.
    """
    progress = progress or Progress(io.StringIO(), enabled=False)
    _fit_columns(read)
    check_errors(read, skip_invalid)
    plan = SwitchPlan(read, dry_run=dry_run, skip_invalid=skip_invalid)
    # Redis is compared first: if it is down, this fails before the database is written.
    todo = plan_against_store(get_store(), read, plan)
    jobs = [item.job for item in read.jobs]
    known = existing_ids(job.id for job in jobs)
    fresh = [job for job in jobs if job.id not in known]
    existing = [job for job in jobs if job.id in known]
    by, using = source_actor(read), router.db_for_write(ZSchedJob)
    with transaction.atomic(using=using):
        if not dry_run:
            _create(fresh, progress)
        changed_ids, versions = _update(existing, progress, dry_run=dry_run) \
            if existing else ([], {})
        recorded = [] if dry_run else [job.id for job in fresh] + changed_ids
        # The rows' outbox entries, in their transaction (see .outbox).
        version = outbox.record(recorded, outbox.SAVE, using=using, by=by)
        versions.update(dict.fromkeys(recorded, version))
    progress.finish()
    verb = "would " if dry_run else ""
    plan.notes.append(f"database: {verb}create {len(fresh)} row(s), {verb}update "
                      f"{len(changed_ids)}, unchanged {len(existing) - len(changed_ids)}")
    if dry_run:
        return plan
    # What Redis lacks or holds differently, and every row just written (at its
    # version, so the outbox has nothing left to push).
    pushed = {job.id for job in todo}
    extra = [job for job in jobs if job.id in set(recorded) - pushed]
    if todo or extra:
        plan.redis = get_store().upsert_many([*todo, *extra], stagger=False,
                                             first_due=plan.first_due, by=by,
                                             versions=versions)
        outbox.confirm((outbox.Change(job_id, version, outbox.SAVE) for job_id in recorded),
                       using)
    return plan
