"""A job's timing in plain words, for the admin's change page and its live preview.

One function serves both, so the words shown while typing are the words shown
after saving.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from zoneinfo import ZoneInfo

from celery_zsched.core.job import Job
from celery_zsched.core.timing import ms_to_dt


def counted(n: int, noun: str) -> str:
    """``1 job``, ``3 jobs``: a count with its noun (plural with an ``s``)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def every(seconds: float) -> str:
    """``every 5 minutes``, ``every 2 hours``, ``every 90 seconds``."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"every {count} {unit}{'s' if count != 1 else ''}"
    return f"every {seconds:g} second{'s' if seconds != 1 else ''}"


def describe_cron(expr: str) -> str:
    """A cron expression in plain words, e.g. ``*/15 * * * *`` -> "Every 15 minutes"."""
    from cron_descriptor import ExpressionDescriptor, Options

    options = Options()
    options.use_24hour_time_format = True
    options.verbose = False
    try:
        return str(ExpressionDescriptor(expr, options).get_description())
    except Exception:  # cron-descriptor raises its own assortment of types
        return expr


def job_in_words(job: Job) -> str:
    """``job``'s timing as a sentence: "Every 15 minutes (Europe/Berlin time)".

    ``job`` has been through :meth:`Job.from_dict`, so its cron and zone are
    valid and a job without any timing already carries the default interval.
    """
    if job.cron:
        text = f"{describe_cron(' '.join(job.cron.split()))} ({job.timezone} time)"
        if job.day_rule == "and":
            # cron-descriptor reads both day fields as a union; say they are ANDed.
            text += ", only on days matching both day fields"
    elif job.run_at is not None:
        local = ms_to_dt(job.run_at).astimezone(ZoneInfo(job.timezone))
        text = f"Once, at {local.strftime('%Y-%m-%d %H:%M:%S %Z')} ({job.timezone})"
    else:
        assert job.interval_s is not None  # from_dict gives a job without timing the default
        text = every(job.interval_s).capitalize()
    if job.jitter_s:
        text += f", plus up to {job.jitter_s:g} s of random jitter"
    return text


def recrawl_words(summary: Mapping[str, Any]) -> str:
    """What change-aware recrawl knows of a job (:func:`celery_zsched.core.recrawl.summary`)."""
    parts = [f"{summary['recrawl']}, {every(round(summary['interval_s'] or 0))} now"]
    rate = summary["change_rate_per_day"]
    if rate is None:
        parts.append("no change reports yet (keeps its interval)")
    else:
        dated = ", dated by Last-Modified" if summary.get("estimator") == "dated" else ""
        parts.append(f"changes about {rate:.3g} times a day "
                     f"(from {summary['visits']:.1f} recent visits{dated})")
        parts.append(f"expected freshness {summary['expected_freshness']:.0%}")
    since = summary["since_last_change_s"]
    parts.append("no change seen yet" if since is None
                 else f"last change seen {every(round(since)).removeprefix('every ')} ago")
    return " · ".join(parts)
