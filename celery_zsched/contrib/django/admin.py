"""The admin of scheduled jobs: next runs from Redis, outcomes, run history and controls.

Reads are cheap at any fleet size: the changelist fetches the live Redis state
of the rows on its page with one :meth:`Store.get_many` call (one round trip,
:mod:`.job_changelist`), and the change page fetches its one job the same way.
Each action (pause, resume, run now, reset failures: :mod:`.job_actions`) is
one :class:`Store` call over every selected id (pipelined and chunked inside;
resume reads the definitions first) plus at most one SQL ``UPDATE``, so
"select all 100,000" stays fast. The run history's admin is in
:mod:`.runs_admin`, the audit trail's in :mod:`.audit_admin`, the outbox's in
:mod:`.outbox_admin`: each registers itself when this module imports it.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import django
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db import models
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from celery_zsched.contrib.django.admin_times import zone_label, zoned, zones_line
from celery_zsched.contrib.django.audit_admin import AuditedAdminMixin, RecentChangesInline
from celery_zsched.contrib.django.conf import get_store
from celery_zsched.contrib.django.dashboard import DashboardAdminView
from celery_zsched.contrib.django.dead_admin import DeadLetterAdminViews
from celery_zsched.contrib.django.domains_admin import DomainAdminViews
from celery_zsched.contrib.django.forms import ZSchedJobForm
from celery_zsched.contrib.django.job_actions import ACTIONS, JobActions
from celery_zsched.contrib.django.job_changelist import ZSchedChangeList, info_of
from celery_zsched.contrib.django.job_columns import (
    badge,
    muted,
    next_run_html,
    schedule_in_words,
)
from celery_zsched.contrib.django.job_filters import (
    DeadLetteredFilter,
    FailingFilter,
    LastStatusFilter,
    QueueFilter,
)
from celery_zsched.contrib.django.models import JobKind, ZSchedJob
from celery_zsched.contrib.django.outbox_admin import ZSchedOutboxAdmin  # noqa: F401  (registers itself)
from celery_zsched.contrib.django.preview_admin import COUNT, fires_html, preview_url
from celery_zsched.contrib.django.preview_admin import urls as preview_urls
from celery_zsched.contrib.django.runs_admin import (
    RecentRunsInline,
    ZSchedRunAdmin,  # noqa: F401  (registers itself)
)
from celery_zsched.contrib.django.words import counted, every, recrawl_words
from celery_zsched.core.errors import ValidationError
from celery_zsched.core.recrawl import summary as recrawl_summary
from celery_zsched.services.preview import preview, preview_info
from celery_zsched.store import JobInfo


@admin.register(ZSchedJob)
class ZSchedJobAdmin(AuditedAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg, misc, unused-ignore]
    """Scheduled jobs: live next runs, outcomes, run history, and controls."""

    change_form_template = "admin/zsched/zschedjob/change_form.html"
    list_display = ("title", "schedule", "next_run", "last_outcome", "short_last_error",
                    "enabled")
    list_display_links = ("title",)
    list_filter = ("enabled", "kind", "transport", LastStatusFilter, QueueFilter, FailingFilter,
                   DeadLetteredFilter)
    search_fields = ("name", "url", "job_id")
    list_per_page = 100
    # Bounds the one get_many call of "show all".
    list_max_show_all = 500
    ordering = ("name", "job_id")
    actions = ACTIONS
    inlines = (RecentRunsInline, RecentChangesInline)

    class Media:
        # Live next fire times as the timing is edited (a static file of this app).
        js = ("zsched/job_preview.js",)

    # Its JSON fields report nesting too deep and 5000-digit numbers as field
    # errors, where Django's would answer with a server error.
    form = ZSchedJobForm
    radio_fields: ClassVar[dict[str, int]] = {"day_rule": admin.VERTICAL}
    # Times through admin_times (last_run, created, updated): each shows its zone.
    readonly_fields = ("schedule_words", "next_fires", "zones", "next_run_detail",
                       "redis_state", "recrawl_detail", "last_outcome", "last_error_full",
                       "last_run", "run_count", "failure_count", "consecutive_failures",
                       "kind", "created", "updated")
    fieldsets = (
        ("Now (live from Redis)", {
            "fields": ("next_run_detail", "last_outcome", "last_error_full", "redis_state"),
        }),
        (None, {"fields": ("name", "url", "domain", "task", "job_id", "enabled")}),
        ("Timing", {
            "fields": ("interval_s", "cron", "timezone", "zones", "day_rule", "schedule_words",
                       "next_fires", "run_at", "jitter_s", "start_at", "end_at", "max_runs",
                       "misfire_grace_s"),
            "description": "Give one of interval, cron or run at. Cron is read on the wall "
                           "clock of the time zone, DST included.",
        }),
        ("Recrawl", {
            "fields": ("recrawl", "min_interval_s", "max_interval_s", "freshness_target",
                       "recrawl_detail"),
            "description": "Adaptive: the interval follows the page's estimated change rate "
                           "(interval jobs only; see the Recrawl policy page).",
        }),
        ("Counters (mirrored from Redis by zsched_drain and zsched_sync)", {
            "fields": ("last_run", "run_count", "failure_count", "consecutive_failures",
                       "kind", "created", "updated"),
        }),
        ("Arguments", {"fields": ("meta", "args", "kwargs"), "classes": ("collapse",)}),
        ("Routing and retries", {
            "fields": ("transport", "queue", "routing_key", "priority", "expires_s",
                       "retry_max", "retry_base_s"),
            "classes": ("collapse",),
        }),
    )
    #: Sections and fields that mean nothing before the job exists.
    _CHANGE_ONLY_SECTIONS = ("Now (live from Redis)",
                             "Counters (mirrored from Redis by zsched_drain and zsched_sync)")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None:
            return self.fieldsets
        out = []
        for title, options in self.fieldsets:
            if title in self._CHANGE_ONLY_SECTIONS:
                continue
            # The add form has its own live next-fires box (change_form.html).
            fields = tuple(f for f in options["fields"] if f != "next_fires")
            out.append((title, {**options, "fields": fields}))
        return out

    def get_inline_instances(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        # A job that is being added has no runs; leaving the inline out also
        # spares the add form a management form to post.
        return super().get_inline_instances(request, obj) if obj is not None else []

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if isinstance(db_field, models.URLField) and django.VERSION >= (5, 0):
            # Scrape targets are http(s) URLs typed in full; say which scheme a
            # bare host gets instead of relying on Django's changing default.
            kwargs.setdefault("assume_scheme", "https")
        if isinstance(db_field, models.DateTimeField) and db_field.editable:
            # The form reads a typed time in TIME_ZONE, whatever the job's zone.
            zone = zone_label(timezone.get_current_timezone_name(), timezone.now())
            kwargs.setdefault("help_text", " ".join(
                filter(None, [str(db_field.help_text), f"Typed in {zone}."])))
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    # ------------------------------------------------------------ changelist
    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ZSchedChangeList

    @admin.display(description="name / URL", ordering="name")
    def title(self, row: ZSchedJob) -> SafeString:
        main = row.name or row.url or row.job_id
        sub = row.url if row.name and row.url else row.job_id
        return format_html("{}<br><small>{}</small>", main, Truncator(sub).chars(80))

    @admin.display(description="kind / schedule", ordering="kind")
    def schedule(self, row: ZSchedJob) -> SafeString:
        if row.kind == JobKind.CRON:
            spec = f"{row.cron} {row.timezone or ''}".strip()
        elif row.kind == JobKind.ONCE and row.run_at is not None:
            spec = zoned(row.run_at, "%Y-%m-%d %H:%M %Z")
        else:
            spec = every(row.interval_s) if row.interval_s else "default interval"
        return format_html("{}<br><small>{}</small>", row.get_kind_display(), spec)

    # Sorted by ZSchedChangeList from the Redis schedule. The database sees
    # "id" only, which the default ordering does not use: otherwise Django
    # would mark this column as sorted whenever the list is sorted by that field.
    @admin.display(description="next run", ordering="id")
    def next_run(self, row: ZSchedJob) -> SafeString:
        return next_run_html(info_of(row))

    @admin.display(description="last outcome", ordering="last_status")
    def last_outcome(self, row: ZSchedJob) -> SafeString:
        # Live from Redis when the state is at hand (it is fetched for the page
        # anyway); the database mirror, which the filters use, otherwise.
        info = info_of(row) if row.pk else None
        status = row.last_status
        if isinstance(info, JobInfo) and info.state.last_outcome:
            status = info.state.last_outcome
        return badge(status)

    def _last_error(self, row: ZSchedJob) -> str:
        info = info_of(row) if row.pk else None
        if isinstance(info, JobInfo) and info.state.last_outcome is not None:
            return info.state.last_error or ""
        return str(row.last_error)

    @admin.display(description="last error")
    def short_last_error(self, row: ZSchedJob) -> SafeString:
        error = self._last_error(row)
        return format_html('<span title="{}">{}</span>', error, Truncator(error).chars(60))

    # ----------------------------------------------------------- change page
    @admin.display(description="schedule in words")
    def schedule_words(self, row: ZSchedJob) -> SafeString:
        # job_preview.js rewrites this span as the timing fields are edited.
        text = schedule_in_words(row) if row.pk else ""
        return format_html('<span id="zsched-words">{}</span>',
                           text or "(the timing in words shows here as you type)")

    @admin.display(description="time zones")
    def zones(self, row: ZSchedJob) -> str:
        # A blank zone is TIME_ZONE's (the default the job takes on save).
        return zones_line(row.timezone or timezone.get_default_timezone_name())

    @admin.display(description="last run at", ordering="last_run_at")
    def last_run(self, row: ZSchedJob) -> str:
        return zoned(row.last_run_at)

    @admin.display(description="created at")
    def created(self, row: ZSchedJob) -> str:
        return zoned(row.created_at) if row.pk else "-"

    @admin.display(description="updated at")
    def updated(self, row: ZSchedJob) -> str:
        return zoned(row.updated_at) if row.pk else "-"

    @admin.display(description=f"next {COUNT} fires")
    def next_fires(self, row: ZSchedJob) -> SafeString:
        # From the store when the job is there (its due time, runs so far,
        # pause), else from the saved definition alone.
        info = info_of(row) if row.pk else None
        try:
            if isinstance(info, JobInfo):
                result = preview_info(info, int(time.time() * 1000), COUNT, get_store().settings)
            else:
                result = preview(row.to_job(), int(time.time() * 1000), COUNT,
                                 get_store().settings)
        except ValidationError as exc:
            return muted(f"cannot preview: {exc}")
        return fires_html(result, preview_url(self))

    @admin.display(description="next run")
    def next_run_detail(self, row: ZSchedJob) -> SafeString:
        return next_run_html(info_of(row), own_zone=True) if row.pk else muted("-")

    @admin.display(description="state in Redis")
    def redis_state(self, row: ZSchedJob) -> str:
        info = info_of(row) if row.pk else None
        if not isinstance(info, JobInfo):
            return "-"
        st = info.state
        parts = [info.status]
        if info.lease_until_ms is not None:
            parts.append("in flight")
        if st.attempt != 1:
            parts.append(f"attempt {st.attempt}")
        if st.crashes:
            parts.append(f"{counted(st.crashes, 'crashed execution')}")
        parts.append(f"{counted(st.runs, 'run')}, {counted(st.failures, 'failure')}, "
                     f"{st.consecutive_failures} in a row")
        return " · ".join(str(p) for p in parts)

    @admin.display(description="what its visits taught")
    def recrawl_detail(self, row: ZSchedJob) -> str:
        info = info_of(row) if row.pk else None
        if not isinstance(info, JobInfo) or info.job.kind != "interval":
            return "-"
        return recrawl_words(recrawl_summary(info.job, info.state, int(time.time() * 1000)))

    @admin.display(description="last error")
    def last_error_full(self, row: ZSchedJob) -> str:
        return (self._last_error(row) if row.pk else "") or "-"

    # ------------------------------------------------------- URLs and buttons
    def get_urls(self) -> list[URLPattern]:
        # Before the defaults: their "<path:object_id>/" would swallow these.
        # Domains have no model of their own; they live under the jobs they pace.
        # So do dead letters, which live in Redis only.
        urls: list[URLPattern] = (preview_urls(self) + DomainAdminViews(self).urls()
                                  + DeadLetterAdminViews(self).urls()
                                  + DashboardAdminView(self).urls() + JobActions(self).urls()
                                  + super().get_urls())
        return urls

    def render_change_form(self, request: HttpRequest, context: dict[str, Any],
                           add: bool = False, change: bool = False, form_url: str = "",
                           obj: ZSchedJob | None = None) -> HttpResponse:
        if obj is not None and obj.pk:
            context["zsched_buttons"] = JobActions(self).buttons(obj)
        # The add form's live next fires (the change page has its next_fires field).
        context["zsched_preview_url"] = preview_url(self)
        return super().render_change_form(request, context, add, change, form_url, obj)
