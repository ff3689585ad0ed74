"""The job model: :class:`ZSchedJob`, the durable definition of a job, and its field lists.

A row is the source of truth of a job's definition. Redis holds a copy of it
plus the timing state; edits reach Redis on commit (see
:mod:`celery_zsched.contrib.django.signals`) or through
:func:`celery_zsched.contrib.django.sync.reconcile`. The runtime fields
(``last_run_at`` … ``consecutive_failures``) only mirror Redis: they are
written by ``history.drain`` and ``sync.reconcile``, never by users.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any, ClassVar

from django.core.exceptions import NON_FIELD_ERRORS, ImproperlyConfigured
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import models, router, transaction
from django.utils import timezone as dj_timezone

from celery_zsched.contrib.django.models.choices import DayRule, JobKind, Recrawl, Transport
from celery_zsched.contrib.django.models.values import (
    JobValidationError,
    from_db_datetime,
    raw_value_problem,
    to_db_datetime,
)
from celery_zsched.core.errors import ValidationError
from celery_zsched.core.job import Defaults, Job
from celery_zsched.core.state import RuntimeState

#: Core :class:`~celery_zsched.core.job.Job` field -> model field, where the names differ.
CORE_TO_MODEL: dict[str, str] = {"id": "job_id"}
MODEL_TO_CORE: dict[str, str] = {model: core for core, model in CORE_TO_MODEL.items()}

#: Read-only mirror of the Redis runtime state, refreshed in bulk.
MIRROR_FIELDS: tuple[str, ...] = (
    "last_run_at", "last_status", "last_error", "run_count", "failure_count",
    "consecutive_failures",
)

_TIME_FIELDS = ("run_at", "start_at", "end_at")


def model_field_for(core_field: str) -> str:
    """The model field a core validation error belongs to (``NON_FIELD_ERRORS`` if none)."""
    name = CORE_TO_MODEL.get(core_field, core_field)
    return name if name in DEFINITION_FIELDS else NON_FIELD_ERRORS


class ZSchedJob(models.Model):
    """One recurring (or one-off) job: the durable definition, plus a runtime mirror.

    Saving or deleting a row reaches Redis after the transaction commits.
    Queryset ``update()``, ``bulk_create()`` and raw SQL send no signals: run
    :func:`celery_zsched.contrib.django.sync.reconcile` (``manage.py zsched_sync``,
    or the periodic task) to bring Redis in line after those.
    """

    job_id = models.CharField(
        "job id", max_length=200, unique=True, blank=True,
        help_text="Left blank: the first 12 hex digits of SHA-1 of the URL.")
    name = models.CharField(max_length=200, blank=True)
    task = models.CharField(
        max_length=200, blank=True,
        help_text="Celery task name. Left blank for URL jobs: CELERY_ZSCHED_DEFAULT_TASK.")
    url = models.URLField("URL", max_length=2000, blank=True)
    meta = models.JSONField(default=dict, blank=True,
                            help_text="JSON object passed to URL tasks as meta=.")
    args = models.JSONField(default=list, blank=True, help_text="JSON list of positional args.")
    kwargs = models.JSONField(default=dict, blank=True, help_text="JSON object of keyword args.")

    kind = models.CharField(max_length=8, choices=JobKind.choices, default=JobKind.INTERVAL,
                            editable=False, db_index=True)
    interval_s = models.FloatField(
        "interval (s)", null=True, blank=True,
        help_text="Seconds between runs. Give one of interval, cron or run at; none: "
                  "CELERY_ZSCHED_DEFAULT_INTERVAL_S.")
    cron = models.CharField(max_length=120, blank=True,
                            help_text="5-field cron expression, e.g. */15 * * * *")
    timezone = models.CharField(
        "time zone", max_length=64, blank=True,
        help_text="IANA zone of the cron expression and of naive times. Blank: TIME_ZONE.")
    day_rule = models.CharField(
        "day rule", max_length=3, choices=DayRule.choices, default=DayRule.OR,
        help_text="When the cron gives both a day of month and a day of week: "
                  "either one matching fires (crontab(5)), or both must match "
                  "(Celery crontab, django-celery-beat). Ignored without a cron.")
    run_at = models.DateTimeField("run at", null=True, blank=True,
                                  help_text="Run once at this time.")
    start_at = models.DateTimeField("start at", null=True, blank=True)
    end_at = models.DateTimeField("end at", null=True, blank=True)
    jitter_s = models.FloatField("jitter (s)", null=True, blank=True)
    queue = models.CharField(max_length=200, blank=True)
    routing_key = models.CharField(max_length=200, blank=True)
    priority = models.PositiveSmallIntegerField(null=True, blank=True)
    expires_s = models.FloatField("expires (s)", null=True, blank=True)
    enabled = models.BooleanField(default=True, db_index=True)
    max_runs = models.PositiveIntegerField(null=True, blank=True)
    misfire_grace_s = models.FloatField("misfire grace (s)", null=True, blank=True)
    retry_max = models.PositiveIntegerField(null=True, blank=True)
    retry_base_s = models.FloatField("retry base (s)", null=True, blank=True)
    domain = models.CharField(
        max_length=253, blank=True,
        help_text="Pace this job under this domain instead of its URL's host "
                  "(per-domain politeness)")
    transport = models.CharField(
        max_length=8, choices=Transport.choices, default=Transport.CELERY, db_index=True,
        help_text="Celery: beat publishes it to a Celery queue. HTTP: never published; "
                  "workers in any language take it from GET /jobs/next (zsched serve).")
    recrawl = models.CharField(
        max_length=8, choices=Recrawl.choices, default=Recrawl.FIXED,
        help_text="Adaptive: the interval follows the page's estimated change rate, "
                  "within the bounds, to meet the freshness target (interval jobs only).")
    min_interval_s = models.FloatField(
        "min interval (s)", null=True, blank=True,
        help_text="Shortest adaptive interval. Blank: a tenth of the interval.")
    max_interval_s = models.FloatField(
        "max interval (s)", null=True, blank=True,
        help_text="Longest adaptive interval. Blank: ten times the interval.")
    freshness_target = models.FloatField(
        "freshness target", null=True, blank=True,
        help_text="Share of time (0-1) the copy should be fresh. "
                  "Blank: CELERY_ZSCHED_FRESHNESS_TARGET.")

    # Runtime mirror of Redis (written in bulk by drain and reconcile).
    last_run_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_status = models.CharField(max_length=20, blank=True, editable=False, db_index=True)
    last_error = models.TextField(blank=True, editable=False)
    run_count = models.PositiveBigIntegerField(default=0, editable=False)
    failure_count = models.PositiveBigIntegerField(default=0, editable=False)
    consecutive_failures = models.PositiveIntegerField(default=0, editable=False)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    #: Grows with every change this package makes to the row: the id of the last
    #: outbox entry recorded for it (:mod:`celery_zsched.contrib.django.outbox`).
    #: Redis refuses a push of an older version, so pushes arriving out of order
    #: never move a job back.
    #: 0: never changed through this package (pushed unversioned).
    version = models.PositiveBigIntegerField(default=0, editable=False)

    objects: ClassVar[models.Manager[ZSchedJob]] = models.Manager()
    # The job id this instance was loaded with: a rename must delete the old one
    # from Redis. ``None`` for instances not loaded from the database.
    _zsched_loaded_id: str | None = None
    # Fields to exclude from full_clean(): clean() files errors about them as
    # non-field errors, because a ModelForm cannot show an error on a field it lacks.
    _zsched_clean_exclude: Collection[str] = ()
    # Fields clean_fields() found invalid, and the core's error, during full_clean().
    _zsched_failed: set[str] = set()  # noqa: RUF012  -- reassigned per instance, never mutated
    _zsched_core_error: ValidationError | None = None
    # definition_values() as of the last successful full_clean(): save() skips
    # validating them again.
    _zsched_valid: tuple[Any, ...] | None = None

    class Meta:
        db_table = "zsched_job"
        verbose_name = "scheduled job"
        verbose_name_plural = "scheduled jobs"

    def __str__(self) -> str:
        label = self.name or self.url or self.task
        return f"{self.job_id} ({label})" if label and label != self.job_id else self.job_id

    @classmethod
    def from_db(cls, db: str | None, field_names: Collection[str], values: Collection[Any],
                *args: Any, **kwargs: Any) -> ZSchedJob:
        # *args/**kwargs: newer Django versions pass more (e.g. fetch_mode).
        instance = super().from_db(db, field_names, values, *args, **kwargs)
        instance._zsched_loaded_id = instance.__dict__.get("job_id")
        return instance

    # ------------------------------------------------------------- core job
    def definition(self) -> dict[str, Any]:
        """This row as a core definition mapping (blank fields left to the defaults)."""
        data: dict[str, Any] = {}
        for name in DEFINITION_FIELDS:
            value = getattr(self, name)
            # Only datetimes: anything else (a string clean_fields() could not
            # parse, a number) goes to Job.from_dict as it is, which rejects it.
            if name in _TIME_FIELDS and isinstance(value, datetime):
                value = from_db_datetime(value)
            data["id" if name == "job_id" else name] = value
        return data

    def to_job(self, defaults: Defaults | None = None) -> Job:
        """The core :class:`~celery_zsched.core.job.Job`, validated by ``Job.from_dict``.

        Raises :class:`celery_zsched.core.errors.ValidationError` naming the core field.
        ``defaults`` come from the Django settings when not given.
        """
        if defaults is None:
            from celery_zsched.contrib.django.conf import get_defaults

            defaults = get_defaults()
        return Job.from_dict(self.definition(), defaults)

    @classmethod
    def from_job(cls, job: Job) -> ZSchedJob:
        """An unsaved row holding ``job``'s definition (``bulk_create`` ready)."""
        row = cls(kind=job.kind)
        row.set_definition(job)
        return row

    def definition_values(self) -> tuple[Any, ...]:
        """The definition fields' current values (to tell whether an edit changed any)."""
        return tuple(getattr(self, name) for name in DEFINITION_FIELDS)

    def set_definition(self, job: Job) -> None:
        """Overwrite every definition field with ``job``'s (runtime mirror untouched)."""
        for name in DEFINITION_FIELDS:
            value = getattr(job, "id" if name == "job_id" else name)
            if name in _TIME_FIELDS:
                value = to_db_datetime(value)
            elif value is None and isinstance(self._meta.get_field(name),
                                              models.CharField | models.TextField):
                value = ""
            setattr(self, name, value)
        self.kind = job.kind

    # ------------------------------------------------------------ validation
    # full_clean() and save() never raise anything but a validation error, for
    # any value of any field: clean_fields() first tries each definition field
    # the way Django will (whose own cleaning raises TypeError, OverflowError
    # or RecursionError on some values), then clean() applies the core rules.
    # Both raise JobValidationError: Django's ValidationError for forms and the
    # admin, and celery_zsched.ValidationError like every other entry point.
    def full_clean(self, exclude: Collection[str] | None = None, *args: Any,
                   **kwargs: Any) -> None:
        self._zsched_clean_exclude = set(exclude or ())
        self._zsched_failed = set()
        self._zsched_core_error = None
        try:
            super().full_clean(exclude, *args, **kwargs)
        except DjangoValidationError as exc:
            raise self._job_error(exc) from exc
        finally:
            self._zsched_clean_exclude = ()
            self._zsched_failed = set()
        # A deep copy: meta, args and kwargs may be changed in place afterwards.
        self._zsched_valid = copy.deepcopy(self.definition_values())

    def clean_fields(self, exclude: Collection[str] | None = None) -> None:
        skip = set(exclude or ())
        errors: dict[str, list[str]] = {}
        for field in self._meta.concrete_fields:
            if field.name in DEFINITION_FIELDS and field.name not in skip:
                problem = raw_value_problem(field, getattr(self, field.attname), self)
                if problem:
                    errors[field.name] = [problem]
        try:
            super().clean_fields(exclude=skip | set(errors))
        except DjangoValidationError as exc:
            errors = exc.update_error_dict(errors)
        # clean() leaves these to the errors above, in Django's words.
        self._zsched_failed = set(errors)
        if errors:
            raise DjangoValidationError(errors)

    def clean(self) -> None:
        """Validate with the core rules; errors land on the model field they concern."""
        try:
            job = self.to_job()
        except ValidationError as exc:
            self._zsched_core_error = exc
            field = model_field_for(exc.field)
            if field in self._zsched_failed:
                return  # clean_fields() reported this field already
            message = exc.message
            if field in self._zsched_clean_exclude:
                field, message = NON_FIELD_ERRORS, f"{exc.field}: {exc.message}"
            raise DjangoValidationError({field: message}) from exc
        # Fill the derived id now, so validate_unique() (run after clean())
        # reports a second row for the same URL as a duplicate.
        if self._zsched_failed:
            return  # full_clean() fails: leave the values as they were given
        if not self.job_id:
            self.job_id = job.id
        self.kind = job.kind
        for name in ("meta", "args", "kwargs"):
            # A string holds JSON for the core (as in a CSV cell), but a JSON
            # string for Django: store what the core read from it.
            if isinstance(getattr(self, name), str):
                setattr(self, name, getattr(job, name))
        if self.domain:
            # Store the canonical form (lower case, IDNA) that Redis paces under.
            self.domain = job.domain or ""
        for name in _TIME_FIELDS:
            # A naive time is in the job's zone for the core, but in TIME_ZONE
            # for Django's save(): store the instant the core validated.
            value = getattr(self, name)
            if isinstance(value, datetime) and dj_timezone.is_naive(value):
                setattr(self, name, to_db_datetime(getattr(job, name)))

    def _job_error(self, exc: DjangoValidationError) -> JobValidationError:
        errors = exc.message_dict
        core = self._zsched_core_error
        if core is None or not {model_field_for(core.field), NON_FIELD_ERRORS} & set(errors):
            # A Django-only error (a type, a duplicate id): name its first field.
            name, messages = next(iter(errors.items()))
            value = getattr(self, name, None) if name != NON_FIELD_ERRORS else None
            core = ValidationError(MODEL_TO_CORE.get(name, name), value, messages[0])
        return JobValidationError(errors, core)

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Validate as :meth:`full_clean` does, then save; Redis follows on commit.

        The row and its outbox entry (:mod:`celery_zsched.contrib.django.outbox`)
        are written in one transaction (this one, or one of their own), so a
        change that is saved always reaches Redis: after the commit, or from the
        outbox's sweeper.

        A row that fails validation is never written: :class:`JobValidationError`
        is raised instead (never ``IntegrityError`` or ``OverflowError``), so the
        database holds no definition Redis cannot follow. Rows validated by
        ``full_clean()`` and unchanged since are not validated twice; saves with
        ``update_fields`` that name no definition field (the runtime mirror)
        are not validated at all. ``bulk_create()``, ``update()`` and raw SQL
        bypass this, as they bypass ``save()``: ``zsched_sync`` reports such rows.
        """
        update_fields = kwargs.get("update_fields")
        if update_fields is None or not set(DEFINITION_FIELDS).isdisjoint(update_fields):
            if self._zsched_valid != self.definition_values():
                self.full_clean()  # derives job_id (from the URL) and kind, too
            if update_fields is not None:
                kwargs["update_fields"] = {*update_fields, "job_id", "kind"}
        # The post_save signal records the outbox entry: in the row's transaction.
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        with transaction.atomic(using=using, savepoint=False):
            super().save(*args, **kwargs)

    def derive_kind(self) -> str:
        """``cron``, ``once`` or ``interval``, as :attr:`Job.kind` would say."""
        if isinstance(self.cron, str) and self.cron.strip():
            return "cron"
        return "once" if self.run_at is not None else "interval"

    # -------------------------------------------------------- runtime mirror
    def apply_state(self, state: RuntimeState) -> bool:
        """Copy a Redis runtime state into the mirror fields; True when any changed."""
        return self.apply_values(mirror_values(state))

    def apply_values(self, values: Mapping[str, Any]) -> bool:
        """Set the given mirror fields; True when any changed."""
        changed = False
        for name, value in values.items():
            if getattr(self, name) != value:
                setattr(self, name, value)
                changed = True
        return changed


def _definition_fields() -> tuple[str, ...]:
    """Every field of the core ``Job``, by its model name, in the order of the model's columns.

    A core field without a column stops the app from loading: the model (and
    a migration) must follow the core.
    """
    columns = [field.name for field in ZSchedJob._meta.local_fields]
    names = [CORE_TO_MODEL.get(field.name, field.name) for field in dataclasses.fields(Job)]
    missing = [name for name in names if name not in columns]
    if missing:
        raise ImproperlyConfigured(f"ZSchedJob has no column for the core Job field(s) {missing}")
    return tuple(sorted(names, key=columns.index))


#: Definition fields: those of :class:`~celery_zsched.core.job.Job` (``id`` is
#: ``job_id``), in the order of the model's columns, which forms follow.
DEFINITION_FIELDS: tuple[str, ...] = _definition_fields()


def mirror_values(state: RuntimeState) -> dict[str, Any]:
    """Mirror field values of one job's Redis runtime state."""
    last = state.last_settled_ms
    return {
        "last_run_at": to_db_datetime(last) if last else None,
        "last_status": state.last_outcome or "",
        "last_error": state.last_error or "",
        "run_count": state.runs,
        "failure_count": state.failures,
        "consecutive_failures": state.consecutive_failures,
    }
