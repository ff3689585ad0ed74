"""Convert static ``beat_schedule`` entries into jobs."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery.schedules import crontab, schedule

from celery_zsched.core.errors import ConfigurationError, ValidationError
from celery_zsched.core.job import Defaults, Job, id_problem

logger = logging.getLogger("celery_zsched")
_OPTIONS = ("queue", "routing_key", "priority", "expires", "transport", "recrawl",
            "min_interval_s", "max_interval_s", "freshness_target")


# (lowest, highest) value of each cron field, in cron's field order.
_CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))


def _cron_field(values: set[int], low: int, high: int) -> str:
    """One cron field that matches exactly ``values`` (``*``, ``*/15``, ``9-17``, ``0,30``)."""
    ordered = sorted(values)
    if ordered == list(range(low, high + 1)):
        return "*"
    first, count = ordered[0], len(ordered)
    step = ordered[1] - first if count > 1 else 0
    if count > 2 and step > 1 and ordered == list(range(first, ordered[-1] + 1, step)):
        # An arithmetic run: "*/15" when it is what "*/15" means, else "5-50/15".
        whole = first == low and ordered[-1] + step > high
        return f"*/{step}" if whole else f"{first}-{ordered[-1]}/{step}"
    parts: list[str] = []
    start = prev = first
    for value in [*ordered[1:], None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return ",".join(parts)


def cron_of_crontab(entry: Any) -> str:  # Any: celery-types lacks crontab.minute etc.
    """The 5-field cron string of a Celery ``crontab``, from the sets Celery itself expanded.

    Written from ``crontab.minute`` ... ``crontab.day_of_week`` (the sets Celery
    matches against), not from the arguments, so every spelling Celery accepts
    (names, steps, ``{0, 30}``, ``range(9, 18)``) means here what it means
    there. The job gets the "and" day rule: Celery ANDs the two day fields.
    """
    sets = (entry.minute, entry.hour, entry.day_of_month, entry.month_of_year,
            entry.day_of_week)
    return " ".join(_cron_field(set(values), low, high)
                    for values, (low, high) in zip(sets, _CRON_RANGES, strict=True))


def static_job_id(name: str) -> str:
    """The job id of a ``beat_schedule`` entry: its name when that is a valid id.

    Entry names are free text (``"send report every monday"``); one that is not
    a valid id gets ``beat-`` and the first 12 hex digits of SHA-1 of the name,
    so it stays the same from one start of beat to the next.
    """
    if id_problem(name) is None:
        return name
    return "beat-" + hashlib.sha1(name.encode("utf-8")).hexdigest()[:12]


def job_from_entry(name: str, entry: dict[str, Any], defaults: Defaults) -> Job:
    """A static job for one ``beat_schedule`` entry (id: :func:`static_job_id` of its name).

    Raises :class:`ConfigurationError` naming the entry for schedules that
    cannot be expressed (``solar``) or invalid values.
    """
    if not isinstance(entry, Mapping):
        raise ConfigurationError(f"beat_schedule[{name!r}]: must be a dict with a task and a "
                                 f"schedule (got {type(entry).__name__})")
    sched = entry.get("schedule")
    # Tuples and lists become lists; other values go to Job.from_dict as they
    # are, so a bad one is reported like any bad field instead of raising here.
    args, kwargs = entry.get("args") or [], entry.get("kwargs") or {}
    data: dict[str, Any] = {"id": static_job_id(name), "name": name, "task": entry.get("task"),
                            "args": list(args) if isinstance(args, list | tuple) else args,
                            "kwargs": dict(kwargs) if isinstance(kwargs, Mapping) else kwargs}
    if isinstance(sched, int | float) and not isinstance(sched, bool):
        data["interval_s"] = sched  # not float(): 10**400 would raise OverflowError here
    elif isinstance(sched, timedelta):
        data["interval_s"] = sched.total_seconds()
    elif isinstance(sched, crontab):
        data["cron"] = cron_of_crontab(sched)
        data["day_rule"] = "and"
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
    options = entry.get("options") or {}
    if not isinstance(options, Mapping):
        raise ConfigurationError(f"beat_schedule[{name!r}].options: must be a dict "
                                 f"(got {type(options).__name__})")
    options = dict(options)
    for key in _OPTIONS:
        if key in options:
            data["expires_s" if key == "expires" else key] = options.pop(key)
    if options:
        logger.warning("beat_schedule[%r]: ignoring unsupported options %s", name, sorted(options))
    try:
        return Job.from_dict(data, defaults)
    except ValidationError as exc:
        raise ConfigurationError(f"beat_schedule[{name!r}].{exc}") from exc
