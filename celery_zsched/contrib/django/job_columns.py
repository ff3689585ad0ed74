"""What the job admin's cells show: the next run from live Redis state, outcome badges,
the schedule in words. Shared by the job list, the job page and the run inlines."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from celery_zsched.contrib.django.admin_times import CLOCK, FULL, zone_or_none, zoned
from celery_zsched.contrib.django.dashboard import OUTCOME_COLOURS
from celery_zsched.contrib.django.job_changelist import UNAVAILABLE
from celery_zsched.contrib.django.models import RunStatus, ZSchedJob
from celery_zsched.contrib.django.words import job_in_words
from celery_zsched.core.errors import ValidationError
from celery_zsched.core.timing import ms_to_dt
from celery_zsched.store import JobInfo

#: Colours of the last-outcome badge (readable on the light and dark admin themes):
#: the dashboard's outcome colours, and grey for a job that has not run.
BADGE_COLOURS: dict[str, str] = {**OUTCOME_COLOURS, "": "#9e9e9e"}


def relative(dt: datetime, now: datetime) -> str:
    """``in 42 s``, ``in 3 min``, ``in 2 h 5 min``, ``due 8 s ago``: short enough for a column."""
    delta = (dt - now).total_seconds()
    seconds = abs(delta)
    if seconds < 1:
        return "due now"
    if seconds < 60:
        text = f"{int(seconds)} s"
    elif seconds < 3600:
        text = f"{int(seconds // 60)} min"
    elif seconds < 86400:
        text = f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    else:
        text = f"{int(seconds // 86400)} d {int(seconds % 86400 // 3600)} h"
    # In the past: beat has not claimed it yet (it is down, or far behind).
    return f"in {text}" if delta > 0 else f"due {text} ago"


def _when(dt: datetime, job_zone: str | None = None) -> SafeString:
    """A time as "in 4 min" over its clock time with its zone; the ISO time in the tooltip.

    With ``job_zone`` (the change page) and a zone other than the admin's, the
    job's own wall-clock time follows, as its cron reads it.
    """
    now = timezone.now()
    local = timezone.localtime(dt)
    same_day = local.date() == timezone.localtime(now).date()
    clock = zoned(dt, CLOCK if same_day else FULL)
    zone = zone_or_none(job_zone) if job_zone else None
    if zone is not None and job_zone != timezone.get_current_timezone_name():
        own = dt.astimezone(zone).strftime(FULL)
        return format_html('<span title="{}"><span style="white-space:nowrap">{}</span>'
                           '<br><small>{}<br>{} ({})</small></span>', local.isoformat(),
                           relative(dt, now), clock, own, job_zone)
    # The clock time may wrap (date / time / zone): the list fits 1,400 px.
    return format_html('<span title="{}"><span style="white-space:nowrap">{}</span><br>'
                       "<small>{}</small></span>", local.isoformat(), relative(dt, now), clock)


def muted(text: str, title: str = "") -> SafeString:
    """Text in the admin's quiet colour, with ``title`` as its tooltip."""
    return format_html('<span style="color:var(--body-quiet-color,#666)" title="{}">{}</span>',
                       title, text)


def next_run_html(info: Any, *, own_zone: bool = False) -> SafeString:
    """What the job does next, from its live Redis state.

    ``own_zone``: also show the time on the job's own zone's clock.
    """
    if info is UNAVAILABLE:
        return muted("Redis unavailable")
    if info is None:
        return muted("not in Redis", "Saved rows reach Redis on commit; "
                                     "manage.py zsched_sync pushes any that are missing.")
    assert isinstance(info, JobInfo)
    if info.lease_until_ms is not None:
        # Queued: published, waiting for a worker (delivery deadline); running:
        # started, kept alive by the worker's heartbeat (execution lease).
        label = "running" if info.status == "running" else "queued"
        return format_html("{}<br><small>{} until {}</small>", label,
                           "lease" if label == "running" else "delivery deadline",
                           zoned(ms_to_dt(info.lease_until_ms), CLOCK))
    if info.paused:
        return muted("paused")
    if info.due_ms is None:
        return muted({"dead": "dead-lettered", "finished": "finished"}.get(info.status,
                                                                            info.status))
    return _when(ms_to_dt(info.due_ms), info.job.timezone if own_zone else None)


def badge(status: str) -> SafeString:
    """A coloured pill for a settle label (``complete``, ``retrying``, ``error`` ...)."""
    label = dict(RunStatus.choices).get(status, status) if status else "never run"
    colour = BADGE_COLOURS.get(status, BADGE_COLOURS[""])
    return format_html(
        '<span class="zsched-badge zsched-{}" style="background:{};color:#fff;'
        'border-radius:9px;padding:1px 8px;white-space:nowrap;font-size:11px">{}</span>',
        status or "none", colour, label)


def schedule_in_words(row: ZSchedJob) -> str:
    """The row's timing as a sentence (empty while the row is invalid)."""
    try:
        return job_in_words(row.to_job())
    except ValidationError:
        return ""
