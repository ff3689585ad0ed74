"""The outbox in the admin: changes saved in the database and not in Redis yet.

Normally empty, or nearly: a change leaves it as soon as Redis confirms its
push. It fills while Redis is unreachable (beat's sweeper empties it within
seconds of Redis being back), and keeps the dead-lettered changes, those that
failed ``zsched_outbox_max_attempts`` times by their own fault (an invalid
row, a change Redis refused), until an operator retries or discards them.
Whoever may see jobs sees the list; whoever may change jobs may act on it.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone as dj_timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from celery_zsched.contrib.django import outbox
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedOutbox
from celery_zsched.contrib.django.readonly import JobRecordsReadOnly


def _can_change_jobs(request: HttpRequest) -> bool:
    opts = ZSchedJob._meta
    return bool(request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}"))


class OutboxStateFilter(admin.SimpleListFilter):
    """Pending (waiting for Redis, or for the next try) or dead-lettered."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("pending", "Pending"), ("dead", "Dead-lettered")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() == "pending":
            return queryset.filter(dead_at__isnull=True)
        if self.value() == "dead":
            return queryset.filter(dead_at__isnull=False)
        return queryset


@admin.register(ZSchedOutbox)
class ZSchedOutboxAdmin(JobRecordsReadOnly, admin.ModelAdmin):  # type: ignore[type-arg, misc, unused-ignore]
    """Changes not yet in Redis, oldest first; retry or discard the dead-lettered ones."""

    list_display = ("created_at", "job", "action", "version", "who", "state", "attempts",
                    "next_try_at", "short_error")
    list_filter = (OutboxStateFilter, "action")
    search_fields = ("job_id",)
    list_per_page = 100
    show_full_result_count = False
    fields = ("job_id", "action", "id", "actor_kind", "actor_name", "note", "created_at",
              "attempts", "next_try_at", "dead_at", "last_error")
    readonly_fields = fields
    actions = ("retry_now", "discard")

    def get_queryset(self, request: HttpRequest) -> QuerySet[ZSchedOutbox]:
        queryset: QuerySet[ZSchedOutbox] = super().get_queryset(request)
        # The job's row, for its link, in the page's one query (none: deleted).
        row = ZSchedJob.objects.filter(job_id=OuterRef("job_id")).values("pk")[:1]
        return queryset.annotate(job_pk=Subquery(row)).order_by("id")

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions: dict[str, Any] = super().get_actions(request)
        if not _can_change_jobs(request):
            return {}
        return actions

    @admin.display(description="job", ordering="job_id")
    def job(self, entry: ZSchedOutbox) -> SafeString:
        pk = getattr(entry, "job_pk", None)
        if pk is None:
            return format_html("{}", entry.job_id)
        return format_html('<a href="{}">{}</a>',
                           reverse("admin:zsched_zschedjob_change", args=[pk]), entry.job_id)

    @admin.display(description="version", ordering="id")
    def version(self, entry: ZSchedOutbox) -> int:
        return int(entry.pk)

    @admin.display(description="by")
    def who(self, entry: ZSchedOutbox) -> str:
        return f"{entry.get_actor_kind_display()}: {entry.actor_name}".rstrip(": ")

    @admin.display(description="state", ordering="dead_at")
    def state(self, entry: ZSchedOutbox) -> SafeString:
        if entry.dead_at is not None:
            return format_html('<strong style="color: var(--error-fg, #ba2121)">dead-lettered'
                               "</strong> {}", dj_timezone.localtime(entry.dead_at)
                               .strftime("%Y-%m-%d %H:%M:%S %Z"))
        return format_html("{}", "pending")

    @admin.display(description="last error")
    def short_error(self, entry: ZSchedOutbox) -> str:
        return str(Truncator(entry.last_error).chars(120)) or "-"

    @admin.action(description="Retry the selected changes now")
    def retry_now(self, request: HttpRequest, queryset: QuerySet[ZSchedOutbox]) -> None:
        count = outbox.retry_dead(queryset)
        self.message_user(request, f"{count} change(s) will be pushed again within "
                          "seconds (beat's outbox sweeper).", messages.SUCCESS)

    @admin.action(description="Discard the selected changes (Redis keeps what it has)")
    def discard(self, request: HttpRequest, queryset: QuerySet[ZSchedOutbox]) -> None:
        count, _ = queryset.delete()
        self.message_user(request, f"Discarded {count} change(s): Redis keeps what it has "
                          "until the jobs change again (or zsched_sync).", messages.WARNING)
