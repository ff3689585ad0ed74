"""django-celery-beat's ``PeriodicTask`` rows as jobs (``zsched_import --from django-celery-beat``).

What maps to what (the README's table says the same):

* interval -> ``interval_s``; crontab -> ``cron`` in the crontab's time zone,
  with Celery's AND rule for the two day fields; clocked -> a one-off ``run_at``;
  solar -> a per-row error (zsched has no solar schedules).
* ``one_off`` on an interval or crontab -> ``max_runs=1``; a one-off that
  already ran is moved paused, as django-celery-beat disables it after its run.
* ``start_time`` -> ``start_at``; ``expires`` (a date-time after which the
  schedule stops) -> ``end_at``; ``expire_seconds`` (each message's expiry) ->
  ``expires_s``; ``enabled`` -> ``enabled``.
* ``queue``, ``routing_key``, ``priority``, ``args``, ``kwargs`` as they are.
* ``description`` (on one line, at most 200 characters) -> ``name``, else the
  row's ``name``; the id is derived from ``name`` as for ``beat_schedule``
  entries, so a row django-celery-beat synced from ``beat_schedule`` and the
  static entry are the same job.
* The next run continues django-celery-beat's timeline: its next run after
  ``last_run_at`` (a row that never ran counts from ``date_changed``, as
  django-celery-beat does, or runs as soon as ``start_time`` allows).

Not carried over (listed per row): ``exchange``, ``headers`` and
``total_run_count``. Crontabs are read in their own time zone, as
django-celery-beat runs them by default (``DJANGO_CELERY_BEAT_TZ_AWARE``).

django-celery-beat is imported lazily, so it stays optional.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from django.apps import apps

from celery_zsched.contrib.django.models import from_db_datetime
from celery_zsched.core.errors import ConfigurationError, ValidationError
from celery_zsched.core.job import Defaults
from celery_zsched.services.sources import (
    DJANGO_CELERY_BEAT,
    SourceJob,
    SourceRead,
    collect,
    crontab_timing,
    interval_timing,
    job_name,
    source_job,
)

_APP = "django_celery_beat"
#: Rows read per query.
_CHUNK = 2000


def _periodic_task_model() -> Any:
    if not apps.is_installed(_APP):
        raise ConfigurationError(
            "reading django-celery-beat's tasks needs it installed and in INSTALLED_APPS "
            "(pip install django-celery-beat; add 'django_celery_beat')")
    from django_celery_beat.models import PeriodicTask

    return PeriodicTask


def _timing(row: Any) -> dict[str, Any]:
    if row.interval_id is not None:
        return interval_timing(timedelta(**{row.interval.period: row.interval.every}))
    if row.crontab_id is not None:
        # The model's schedule is the Celery crontab that django-celery-beat runs.
        return crontab_timing(row.crontab.schedule, str(row.crontab.timezone))
    if row.clocked_id is not None:
        return {"run_at": from_db_datetime(row.clocked.clocked_time)}
    if row.solar_id is not None:
        raise ValidationError("solar", str(row.solar),
                              "solar schedules cannot be moved: zsched has none; "
                              "use a crontab at a fixed time, or keep this task elsewhere")
    raise ValidationError("schedule", None, "the row has no schedule")


def _headers_lost(raw: str | None) -> list[str]:
    try:
        headers = json.loads(raw or "{}")
    except ValueError:
        return [f"headers={raw!r} (not JSON)"]
    return [f"headers={headers!r}"] if headers else []


def _options(row: Any) -> tuple[dict[str, Any], list[str]]:
    data: dict[str, Any] = {"queue": row.queue, "routing_key": row.routing_key,
                            "priority": row.priority, "expires_s": row.expire_seconds,
                            "end_at": from_db_datetime(row.expires)}
    lost = [f"exchange={row.exchange!r}"] if row.exchange else []
    lost += _headers_lost(row.headers)
    if row.total_run_count:
        lost.append(f"total_run_count={row.total_run_count}")
    return {k: v for k, v in data.items() if v not in (None, "")}, lost


def periodic_task_job(row: Any, defaults: Defaults) -> SourceJob:
    """One ``PeriodicTask`` row as a job (raises :class:`ValidationError` naming the field)."""
    timing = _timing(row)
    options, lost = _options(row)
    data: dict[str, Any] = {
        "name": job_name(row.description, row.name), "task": row.task,
        "args": row.args or None, "kwargs": row.kwargs or None,
        "start_at": from_db_datetime(row.start_time), **timing, **options,
    }
    # django-celery-beat disables a one-off after its run (clocked ones included).
    already_ran = row.one_off and row.total_run_count > 0
    data["enabled"] = bool(row.enabled) and not already_ran
    if row.one_off and "run_at" not in data:
        data["max_runs"] = 1
    last = from_db_datetime(row.last_run_at)
    if last is None and row.start_time is None:
        # ModelEntry counts a row that never ran from its last change ...
        last = from_db_datetime(row.date_changed)
    # ... or, with a start_time, from 30 years back (due once start_time comes): None.
    return source_job(row.name, data, defaults, last, lost)


def _rows() -> Iterator[Any]:
    model = _periodic_task_model()
    query = model.objects.select_related("interval", "crontab", "solar", "clocked")
    last = 0
    while True:
        rows = list(query.filter(pk__gt=last).order_by("pk")[:_CHUNK])
        if not rows:
            return
        yield from rows
        last = rows[-1].pk


def read_periodic_tasks(defaults: Defaults) -> SourceRead:
    """Every ``PeriodicTask`` row; a row that cannot be moved is an error naming it."""
    def builder(row: Any) -> Callable[[], SourceJob]:
        return lambda: periodic_task_job(row, defaults)

    return collect(DJANGO_CELERY_BEAT, ((f"PeriodicTask {row.name!r} (id {row.pk})",
                                         builder(row)) for row in _rows()))
