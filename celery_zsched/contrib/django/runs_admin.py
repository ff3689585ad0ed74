"""Columns of run history, shared by the "Job runs" list and the job page's recent runs.

Times are to the second and carry their zone. Two delays tell where a run
lost time: **wait** is picked up minus scheduled (task start minus due time:
all the delay before the task ran), **lateness** is beat's share of it
(published minus due). Wait minus lateness is the time in the broker queue.
"""

from __future__ import annotations

from datetime import datetime

from django.contrib import admin
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from celery_zsched.contrib.django.admin_times import zoned
from celery_zsched.contrib.django.models import ZSchedRun

#: What the two delays mean, under the list and in the README.
DELAYS_HELP = ("Wait: picked up minus scheduled (task start minus due time), all the delay "
               "before the task ran. Lateness: published minus scheduled, beat's share of "
               "it; the rest is time in the broker queue.")


def ms_text(value: int | None) -> str:
    """``420 ms``, ``12.5 s``; ``-`` for none."""
    if value is None:
        return "-"
    return f"{value} ms" if abs(value) < 10_000 else f"{value / 1000:.1f} s"


def when_html(dt: datetime | None) -> SafeString:
    """A time to the second with its zone, wrapping between date, time and zone only
    (a browser would break the date at its hyphens)."""
    return format_html_join(" ", '<span style="white-space:nowrap">{}</span>',
                            ((part,) for part in zoned(dt).split(" ")))


def _between(start: datetime | None, end: datetime | None) -> int | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds() * 1000)


def wait_ms(run: ZSchedRun) -> int | None:
    """Picked up minus scheduled, from the two times, else from the two recorded delays."""
    between = _between(run.due_at, run.started_at)
    if between is not None:
        return between
    if run.lateness_ms is None or run.wait_ms is None:
        return None
    return run.lateness_ms + run.wait_ms


class RunColumns:
    """Display methods of a run's times and delays (mixed into an admin or an inline)."""

    @admin.display(description="job", ordering="job_id")
    def job_name(self, run: ZSchedRun) -> SafeString:
        # run.job comes with the page's one JOIN (list_select_related); None for
        # jobs with no row (CLI-added, static beat_schedule, deleted).
        job = run.job
        name = (job.name or job.url) if job is not None else ""
        if not name:
            return format_html("{}", run.job_id)
        return format_html('{}<br><small style="overflow-wrap:anywhere">{}</small>', name,
                           run.job_id)

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, run: ZSchedRun) -> SafeString:
        return when_html(run.finished_at)

    @admin.display(description="scheduled", ordering="due_at")
    def scheduled(self, run: ZSchedRun) -> SafeString:
        return when_html(run.due_at)

    @admin.display(description="wait")
    def wait(self, run: ZSchedRun) -> str:
        return ms_text(wait_ms(run))

    @admin.display(description="lateness", ordering="lateness_ms")
    def lateness(self, run: ZSchedRun) -> str:
        return ms_text(run.lateness_ms)

    @admin.display(description="duration", ordering="duration_ms")
    def duration(self, run: ZSchedRun) -> str:
        return ms_text(run.duration_ms)
