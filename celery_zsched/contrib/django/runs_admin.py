"""Run history in the admin: the "Job runs" list, and the job page's recent runs.

Times are to the second and carry their zone. Two delays tell where a run
lost time: **wait** is picked up minus scheduled (task start minus due time:
all the delay before the task ran), **lateness** is beat's share of it
(published minus due). Wait minus lateness is the time in the broker queue.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from celery_zsched.contrib.django.admin_times import zoned
from celery_zsched.contrib.django.job_columns import badge
from celery_zsched.contrib.django.models import ZSchedRun
from celery_zsched.contrib.django.readonly import JobRecordsReadOnly

#: What the two delays mean, under the list and in the README.
DELAYS_HELP = ("Wait: picked up minus scheduled (task start minus due time), all the delay "
               "before the task ran. Lateness: published minus scheduled, beat's share of "
               "it; the rest is time in the broker queue.")
#: Runs shown inline on the change page; the full history is under "Job runs".
RECENT_RUNS = 20


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


class RecentRunsFormSet(BaseInlineFormSet):  # type: ignore[type-arg, misc, unused-ignore]
    """Only the newest :data:`RECENT_RUNS` runs (the inline admin cannot slice)."""

    def get_queryset(self) -> QuerySet[Any]:
        if not hasattr(self, "_recent"):
            # Slicing here, after the formset has filtered by job: a sliced
            # queryset cannot be filtered any more.
            self._recent = super().get_queryset().order_by("-finished_at", "-id")[:RECENT_RUNS]
        return self._recent


class RecentRunsInline(JobRecordsReadOnly, RunColumns,
                       admin.TabularInline):  # type: ignore[type-arg, misc, unused-ignore]
    """The job's newest runs, read-only (history is written by ``zsched_drain`` only)."""

    model = ZSchedRun
    formset = RecentRunsFormSet
    # Without the label line Django's tabular inline puts over each row.
    template = "admin/zsched/readonly_inline.html"
    fk_name = "job"
    extra = 0
    can_delete = False
    verbose_name_plural = f"recent runs (newest {RECENT_RUNS}, copied from Redis by zsched_drain)"
    help_text = DELAYS_HELP  # shown under the heading by readonly_inline.html
    fields = ("finished", "status_badge", "attempt", "scheduled", "wait", "lateness",
              "duration", "short_error", "task_id")
    readonly_fields = fields

    @admin.display(description="status")
    def status_badge(self, run: ZSchedRun) -> SafeString:
        return badge(run.status)

    @admin.display(description="error")
    def short_error(self, run: ZSchedRun) -> str:
        return str(Truncator(run.error).chars(120))


@admin.register(ZSchedRun)
class ZSchedRunAdmin(RunColumns, admin.ModelAdmin):  # type: ignore[type-arg, misc, unused-ignore]
    """The whole run history, read-only (written by ``zsched_drain``)."""

    change_list_template = "admin/zsched/zschedrun/change_list.html"
    # The attempt goes under the status: the list fits 1,400 px with both sidebars.
    list_display = ("finished", "job_name", "status_badge", "scheduled", "wait", "lateness",
                    "duration", "short_error")
    list_filter = ("status",)
    # job_id is the foreign key's column: a job id matches exactly (icontains is no
    # lookup of a foreign key, and any search crashed with it); a task id in part.
    search_fields = ("job_id__exact", "task_id")
    date_hierarchy = "finished_at"
    list_per_page = 100
    # The job's name: one outer join in the page's query (runs of jobs without
    # a row keep their id).
    list_select_related = ("job",)
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[ZSchedRun]:
        return super().get_queryset(request).order_by("-finished_at", "-id")

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().changelist_view(request, {"zsched_help": DELAYS_HELP,
                                                 **(extra_context or {})})

    @admin.display(description="status", ordering="status")
    def status_badge(self, run: ZSchedRun) -> SafeString:
        if run.attempt > 1:
            return format_html("{}<br><small>attempt {}</small>", badge(run.status),
                               run.attempt)
        return badge(run.status)

    @admin.display(description="error")
    def short_error(self, run: ZSchedRun) -> str:
        return str(Truncator(run.error).chars(80))
