"""The admin of scheduled jobs: next runs from Redis, outcomes, run history and controls.

Reads are cheap at any fleet size: the changelist fetches the live Redis state
of the rows on its page with one :meth:`Store.get_many` call (one round trip),
and the change page fetches its one job the same way. Each action (pause,
resume, run now, reset failures) is one :class:`Store` call over every selected
id (pipelined and chunked inside; resume reads the definitions first) plus at
most one SQL ``UPDATE``, so "select all 100,000" stays fast.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, ClassVar

import django
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.views.decorators.http import require_POST

from celery_zsched.contrib.django.admin_times import (
    CLOCK,
    FULL,
    zone_label,
    zone_or_none,
    zoned,
    zones_line,
)
from celery_zsched.contrib.django.audit import admin_actor, request_note
from celery_zsched.contrib.django.audit_admin import AuditedAdminMixin, RecentChangesInline
from celery_zsched.contrib.django.conf import get_store
from celery_zsched.contrib.django.dashboard import OUTCOME_COLOURS, DashboardAdminView
from celery_zsched.contrib.django.dead_admin import DeadLetterAdminViews
from celery_zsched.contrib.django.domains_admin import DomainAdminViews
from celery_zsched.contrib.django.forms import ZSchedJobForm
from celery_zsched.contrib.django.job_filters import DeadLetteredFilter, QueueFilter
from celery_zsched.contrib.django.models import JobKind, RunStatus, ZSchedJob, ZSchedRun
from celery_zsched.contrib.django.next_run_order import next_run_page
from celery_zsched.contrib.django.operations import OPERATIONS, apply_operation
from celery_zsched.contrib.django.outbox_admin import ZSchedOutboxAdmin  # noqa: F401  (registers itself)
from celery_zsched.contrib.django.preview_admin import COUNT, fires_html, preview_url
from celery_zsched.contrib.django.preview_admin import urls as preview_urls
from celery_zsched.contrib.django.readonly import JobRecordsReadOnly
from celery_zsched.contrib.django.runs_admin import DELAYS_HELP, RunColumns
from celery_zsched.contrib.django.words import every, job_in_words
from celery_zsched.core.errors import JobNotFound, StoreUnavailable, ValidationError
from celery_zsched.core.timing import ms_to_dt
from celery_zsched.services.preview import preview, preview_info
from celery_zsched.store import JobInfo, Store

#: Attribute of a row instance that holds its live Redis state for this request.
#: Set per instance (never on the shared ModelAdmin), so concurrent requests
#: of a threaded server cannot see each other's rows.
INFO_ATTR = "_zsched_info"
#: Attribute of a row instance that links it to the other rows of its page.
PAGE_ATTR = "_zsched_page"
#: Placeholder for "the Redis read failed", distinct from "no such job" (None).
_UNAVAILABLE = object()
#: Runs shown inline on the change page; the full history is under "Job runs".
RECENT_RUNS = 20

#: Colours of the last-outcome badge (readable on the light and dark admin themes):
#: the dashboard's outcome colours, and grey for a job that has not run.
BADGE_COLOURS: dict[str, str] = {**OUTCOME_COLOURS, "": "#9e9e9e"}


# ----------------------------------------------------------- live Redis state
def attach_infos(store: Store, rows: Sequence[ZSchedJob]) -> None:
    """Fetch the live state of ``rows`` in one round trip and cache it on each row."""
    try:
        infos: list[Any] = list(store.get_many([row.job_id for row in rows]))
    except StoreUnavailable:
        infos = [_UNAVAILABLE] * len(rows)
    for row, info in zip(rows, infos, strict=True):
        setattr(row, INFO_ATTR, info)


def info_of(row: ZSchedJob) -> Any:
    """The row's cached :class:`JobInfo`, fetched with its page on first use.

    ``None`` when the job is not in Redis, :data:`_UNAVAILABLE` when Redis
    could not be reached.
    """
    if INFO_ATTR not in row.__dict__:
        page: _Page | None = row.__dict__.get(PAGE_ATTR)
        if page is not None:
            page.load()
        else:
            attach_infos(get_store(), [row])
    return row.__dict__[INFO_ATTR]


class _Page:
    """The rows of one changelist page; the first row rendered loads them all."""

    def __init__(self, rows: list[ZSchedJob]) -> None:
        self.rows = rows
        self.loaded = False

    def load(self) -> None:
        if not self.loaded:
            self.loaded = True
            attach_infos(get_store(), self.rows)


class ZSchedChangeList(ChangeList):
    """A changelist that reads its page's Redis state with one ``get_many`` call.

    Lazily: the read happens when the first row is rendered, so requests that
    build a changelist without rendering it (an action POST) cost no round trip.
    """

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        descending = self._next_run_sort()
        if descending is not None:
            # The database cannot sort by next run: the page comes from Redis.
            if self.show_all and self.can_show_all:
                offset, limit = 0, self.result_count
            else:
                offset, limit = (self.page_num - 1) * self.list_per_page, self.list_per_page
            try:
                sorted_page = next_run_page(self.queryset, offset, limit,
                                            descending=descending, count=self.result_count)
            except StoreUnavailable as exc:
                messages.error(request, f"Cannot sort by next run: {exc}")
            else:
                self.result_list = sorted_page.rows
                if sorted_page.truncated_after:
                    messages.warning(request, "Sorting by next run stopped after "
                                     f"{sorted_page.truncated_after:,} scheduled jobs, "
                                     "before this page was full: narrow the filters.")
        # Iterating the page's queryset fills its result cache, so the template
        # later renders these very instances.
        rows = list(self.result_list)
        page = _Page(rows)
        for row in rows:
            row.__dict__[PAGE_ATTR] = page

    def _next_run_sort(self) -> bool | None:
        """``descending`` when next run is the first sort column, else ``None``."""
        columns = self.get_ordering_field_columns()
        first = next(iter(columns.items()), None)
        # ?o= is the user's: an index past the columns sorts by nothing, as Django's own
        # ordering ignores it.
        if first is None or not 0 <= first[0] < len(self.list_display) \
                or self.list_display[first[0]] != "next_run":
            return None
        return first[1] == "desc"


# --------------------------------------------------------------- formatting
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


def _muted(text: str, title: str = "") -> SafeString:
    return format_html('<span style="color:var(--body-quiet-color,#666)" title="{}">{}</span>',
                       title, text)


def next_run_html(info: Any, *, own_zone: bool = False) -> SafeString:
    """What the job does next, from its live Redis state.

    ``own_zone``: also show the time on the job's own zone's clock.
    """
    if info is _UNAVAILABLE:
        return _muted("Redis unavailable")
    if info is None:
        return _muted("not in Redis", "Saved rows reach Redis on commit; "
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
        return _muted("paused")
    if info.due_ms is None:
        return _muted({"dead": "dead-lettered", "finished": "finished"}.get(info.status,
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


# ------------------------------------------------------------------ filters
class FailingFilter(admin.SimpleListFilter):
    """Jobs whose latest settles failed (``consecutive_failures > 0`` in the mirror)."""

    title = "failing"
    parameter_name = "failing"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Failing now"), ("no", "Not failing")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() == "yes":
            return queryset.filter(consecutive_failures__gt=0)
        if self.value() == "no":
            return queryset.filter(consecutive_failures=0)
        return None


class LastStatusFilter(admin.SimpleListFilter):
    """The last settle label, with "never run" for rows without one."""

    title = "last status"
    parameter_name = "last_status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [*RunStatus.choices, ("none", "Never run")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value == "none":
            return queryset.filter(last_status="")
        if value:
            return queryset.filter(last_status=value)
        return None


# ------------------------------------------------------------------- inlines
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


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


# -------------------------------------------------------------------- actions
def _make_action(operation: str, description: str) -> Callable[..., None]:
    def action(modeladmin: ZSchedJobAdmin, request: HttpRequest,
               queryset: QuerySet[ZSchedJob]) -> None:
        modeladmin.run_operation(request, operation, queryset)

    action.__name__ = f"{operation}_jobs"
    decorated: Callable[..., None] = admin.action(
        description=description, permissions=("change",))(action)
    return decorated


# ---------------------------------------------------------------- job admin
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
    actions = (
        _make_action("pause", "Pause selected jobs"),
        _make_action("resume", "Resume selected jobs"),
        _make_action("run_now", "Run selected jobs now"),
        _make_action("reset_failures", "Reset failures of selected jobs"),
    )
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
                       "redis_state", "last_outcome", "last_error_full", "last_run", "run_count",
                       "failure_count", "consecutive_failures", "kind", "created", "updated")
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
            return _muted(f"cannot preview: {exc}")
        return fires_html(result, preview_url(self))

    @admin.display(description="next run")
    def next_run_detail(self, row: ZSchedJob) -> SafeString:
        return next_run_html(info_of(row), own_zone=True) if row.pk else _muted("-")

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
            parts.append(f"{_count(st.crashes, 'crashed execution')}")
        parts.append(f"{_count(st.runs, 'run')}, {_count(st.failures, 'failure')}, "
                     f"{st.consecutive_failures} in a row")
        return " · ".join(str(p) for p in parts)

    @admin.display(description="last error")
    def last_error_full(self, row: ZSchedJob) -> str:
        return (self._last_error(row) if row.pk else "") or "-"

    # ---------------------------------------------------------------- actions
    def run_operation(self, request: HttpRequest, operation: str,
                      queryset: QuerySet[ZSchedJob]) -> bool:
        """Apply ``operation`` and report it as an admin message; False on failure."""
        try:
            note = request_note(request)
        except ValueError as exc:
            self.message_user(request, f"Nothing changed: {exc}", messages.ERROR)
            return False
        try:
            result = apply_operation(operation, queryset, by=admin_actor(request), note=note)
        except JobNotFound as exc:
            self.message_user(request, f"{exc}: it is not in Redis yet; run "
                              "manage.py zsched_sync to push it.", messages.ERROR)
            return False
        except StoreUnavailable as exc:
            self.message_user(request, f"Nothing changed: {exc}", messages.ERROR)
            return False
        past = OPERATIONS[operation][1]
        noun = "job" if result.rows == 1 else "jobs"
        self.message_user(request, f"{past} {result.rows} {noun} ({result.changed} changed in "
                          f"Redis, {result.seconds * 1000:.0f} ms).", messages.SUCCESS)
        if result.pending:
            self.message_user(request, f"{_count(result.pending, 'job')} saved but not in Redis "
                              "yet: the change waits in the outbox and reaches beat within "
                              "seconds of Redis being reachable.", messages.WARNING)
        return True

    def get_urls(self) -> list[URLPattern]:
        opts = self.model._meta
        name = f"{opts.app_label}_{opts.model_name}"
        custom = [
            path(f"<path:object_id>/{op.replace('_', '-')}/",
                 self.admin_site.admin_view(self._button_view(op)), name=f"{name}_{op}")
            for op in OPERATIONS
        ]
        # Before the defaults: their "<path:object_id>/" would swallow these.
        # Domains have no model of their own; they live under the jobs they pace.
        # So do dead letters, which live in Redis only.
        urls: list[URLPattern] = (preview_urls(self) + DomainAdminViews(self).urls()
                                  + DeadLetterAdminViews(self).urls()
                                  + DashboardAdminView(self).urls() + custom
                                  + super().get_urls())
        return urls

    def _button_view(self, operation: str) -> Callable[..., HttpResponse]:
        @require_POST  # type: ignore[untyped-decorator, unused-ignore]
        def view(request: HttpRequest, object_id: str) -> HttpResponse:
            row = get_object_or_404(ZSchedJob, pk=object_id)
            if not self.has_change_permission(request, row):
                raise PermissionDenied
            self.run_operation(request, operation, ZSchedJob.objects.filter(pk=row.pk))
            opts = self.model._meta
            return HttpResponseRedirect(reverse(
                f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change",
                args=[row.pk]))

        handler: Callable[..., HttpResponse] = view
        return handler

    def render_change_form(self, request: HttpRequest, context: dict[str, Any],
                           add: bool = False, change: bool = False, form_url: str = "",
                           obj: ZSchedJob | None = None) -> HttpResponse:
        if obj is not None and obj.pk:
            opts = self.model._meta
            context["zsched_buttons"] = [
                (reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_{op}",
                         args=[obj.pk]), label)
                for op, label in (("resume", "Resume") if not obj.enabled else ("pause", "Pause"),
                                  ("run_now", "Run now"), ("reset_failures", "Reset failures"))
            ]
        # The add form's live next fires (the change page has its next_fires field).
        context["zsched_preview_url"] = preview_url(self)
        return super().render_change_form(request, context, add, change, form_url, obj)


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
