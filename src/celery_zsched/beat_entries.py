"""Convert static ``beat_schedule`` entries into jobs."""

from __future__ import annotations

import hashlib
import logging
from datetime import timedelta
from typing import Any

from celery.schedules import crontab, schedule

from .errors import ConfigurationError, ValidationError
from .job import _ID_RE, Defaults, Job

logger = logging.getLogger("celery_zsched")
_OPTIONS = ("queue", "routing_key", "priority", "expires")


def _cron_field(value: Any) -> str:
    # crontab takes a string, a number or an iterable of numbers ({0, 30}, range(9, 18)).
    if isinstance(value, str | int):
        return str(value)
    return ",".join(str(v) for v in sorted(value))


def _cron_of(entry: Any) -> str:
    parts = (entry._orig_minute, entry._orig_hour, entry._orig_day_of_month,
             entry._orig_month_of_year, entry._orig_day_of_week)
    return " ".join(_cron_field(p) for p in parts)


def static_job_id(name: str) -> str:
    """The job id of a ``beat_schedule`` entry: its name when that is a valid id.

    Entry names are free text (``"send report every monday"``); one that is not
    a valid id gets ``beat-`` and the first 12 hex digits of SHA-1 of the name,
    so it stays the same from one start of beat to the next.
    """
    if _ID_RE.match(name):
        return name
    return "beat-" + hashlib.sha1(name.encode("utf-8")).hexdigest()[:12]


def job_from_entry(name: str, entry: dict[str, Any], defaults: Defaults) -> Job:
    """A static job for one ``beat_schedule`` entry (id: :func:`static_job_id` of its name).

    Raises :class:`ConfigurationError` naming the entry for schedules that
    cannot be expressed (``solar``) or invalid values.
    """
    sched = entry.get("schedule")
    data: dict[str, Any] = {"id": static_job_id(name), "name": name, "task": entry.get("task"),
                            "args": list(entry.get("args") or ()),
                            "kwargs": dict(entry.get("kwargs") or {})}
    if isinstance(sched, int | float) and not isinstance(sched, bool):
        data["interval_s"] = float(sched)
    elif isinstance(sched, timedelta):
        data["interval_s"] = sched.total_seconds()
    elif isinstance(sched, crontab):
        data["cron"] = _cron_of(sched)
        tz = getattr(sched, "tz", None)
        if tz is not None and str(tz) != "None":
            data["timezone"] = str(tz)
    elif type(sched) is schedule:
        run_every: Any = sched.run_every  # type: ignore[attr-defined]
        data["interval_s"] = float(run_every.total_seconds())
    else:
        raise ConfigurationError(
            f"beat_schedule[{name!r}].schedule: {type(sched).__name__} is not supported "
            "(use a number, timedelta, schedule or crontab)")
    options = dict(entry.get("options") or {})
    for key in _OPTIONS:
        if key in options:
            data["expires_s" if key == "expires" else key] = options.pop(key)
    if options:
        logger.warning("beat_schedule[%r]: ignoring unsupported options %s", name, sorted(options))
    try:
        return Job.from_dict(data, defaults)
    except ValidationError as exc:
        raise ConfigurationError(f"beat_schedule[{name!r}].{exc}") from exc
