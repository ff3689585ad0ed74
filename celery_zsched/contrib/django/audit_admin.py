"""The audit trail in the admin: who changed a job, shown on its page and in a searchable list.

:class:`AuditedAdminMixin` makes the job admin record its saves, deletes and
actions as made by the request's user, adds a note field next to the action
menu, and copies pending audit entries from Redis before a job's page shows
them. :class:`RecentChangesInline` lists a job's newest changes on its page;
:class:`ZSchedJobChangeAdmin` is the whole trail, searchable by job id, actor
and note, filterable by action and kind of actor, and read-only for everyone.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.helpers import ActionForm
from django.db.models import Model, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from celery_zsched.contrib.django.audit import acting, admin_actor, drain_quietly
from celery_zsched.contrib.django.models import ZSchedJobChange
from celery_zsched.contrib.django.readonly import JobRecordsReadOnly
from celery_zsched.core.audit import NOTE_MAX

#: The POST field of the note typed with a save on the job's add or change page.
NOTE_FIELD = "zsched_note"
#: Changes shown inline on a job's page; the whole trail is under "Job changes".
RECENT_CHANGES = 20
#: A diff value longer than this is cut on the pages (the row keeps it whole).
VALUE_WIDTH = 60


class AuditActionForm(ActionForm):
    """The changelist's action menu, with a note kept with the change (for pause...)."""

    note = forms.CharField(
        required=False, max_length=NOTE_MAX, label="Note",
        widget=forms.TextInput(attrs={"placeholder": "why (optional, kept in the audit trail)",
                                      "size": 40}))


class AuditedAdminMixin:
    """Records the job admin's saves, deletes and actions as made by the request's user."""

    action_form = AuditActionForm

    def save_model(self, request: HttpRequest, obj: Model, form: Any, change: bool) -> None:
        # Redis is written on commit; the signal handlers bind the actor now.
        note = str(request.POST.get(NOTE_FIELD, "")).strip()[:NOTE_MAX]
        with acting(admin_actor(request), note):
            super().save_model(request, obj, form, change)  # type: ignore[misc]

    def render_change_form(self, request: HttpRequest, context: dict[str, Any],
                           add: bool = False, change: bool = False, form_url: str = "",
                           obj: Model | None = None) -> HttpResponse:
        # The form's own fields are the definition: the note is a plain input
        # the template draws under them, read by save_model.
        context["zsched_note_field"] = NOTE_FIELD
        response: HttpResponse = super().render_change_form(  # type: ignore[misc]
            request, context, add, change, form_url, obj)
        return response

    def delete_model(self, request: HttpRequest, obj: Model) -> None:
        with acting(admin_actor(request)):
            super().delete_model(request, obj)  # type: ignore[misc]

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        with acting(admin_actor(request)):
            super().delete_queryset(request, queryset)  # type: ignore[misc]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # The drain task copies the trail every minute; a job's page shows the
        # changes made a moment ago too.
        drain_quietly()
        response: HttpResponse = super().change_view(  # type: ignore[misc]
            request, object_id, form_url, extra_context)
        return response


def diff_html(change: ZSchedJobChange) -> SafeString:
    """A change's diff, one ``field: old → new`` line per field."""
    diff = change.diff if isinstance(change.diff, dict) else {}
    if not diff:
        return format_html("{}", "-")
    return format_html_join(
        "", "<div><b>{}</b>: {} &rarr; {}</div>",
        ((name, _value(pair[0]), _value(pair[1])) for name, pair in sorted(diff.items())
         if isinstance(pair, list) and len(pair) == 2))


def _value(value: Any) -> str:
    if value is None:
        return "-"
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return str(Truncator(text).chars(VALUE_WIDTH))




class RecentChangesFormSet(BaseInlineFormSet):  # type: ignore[type-arg, misc, unused-ignore]
    """Only the newest :data:`RECENT_CHANGES` changes (the inline admin cannot slice)."""

    def get_queryset(self) -> QuerySet[Any]:
        if not hasattr(self, "_recent"):
            self._recent = super().get_queryset().order_by("-at", "-id")[:RECENT_CHANGES]
        return self._recent


class RecentChangesInline(JobRecordsReadOnly, admin.TabularInline):  # type: ignore[type-arg, misc, unused-ignore]
    """The job's newest changes: who, when, what and why, read-only."""

    model = ZSchedJobChange
    formset = RecentChangesFormSet
    fk_name = "job"
    extra = 0
    can_delete = False
    verbose_name_plural = (f"recent changes (newest {RECENT_CHANGES}; all under "
                           "Job changes)")
    fields = ("at", "action", "who", "changes", "note")
    readonly_fields = fields
    # Rows without the label line ("ZSchedJobChange object (N)"), as the runs inline.
    template = "admin/zsched/readonly_inline.html"

    @admin.display(description="by")
    def who(self, change: ZSchedJobChange) -> str:
        return f"{change.get_actor_kind_display()}: {change.actor_name}".rstrip(": ")

    @admin.display(description="changed fields")
    def changes(self, change: ZSchedJobChange) -> SafeString:
        return diff_html(change)


@admin.register(ZSchedJobChange)
class ZSchedJobChangeAdmin(JobRecordsReadOnly, admin.ModelAdmin):  # type: ignore[type-arg, misc, unused-ignore]
    """Every recorded change of every job (copied from Redis by ``zsched_drain``)."""

    list_display = ("at", "job_id", "action", "actor_kind", "actor_name", "changes",
                    "short_note")
    list_filter = ("action", "actor_kind")
    # And the exact job id (get_search_results): the job column is a foreign key.
    search_fields = ("actor_name", "note")
    date_hierarchy = "at"
    list_per_page = 100
    # The job column is the raw id: a deleted job's trail stays readable.
    list_select_related = False
    show_full_result_count = False
    fields = ("at", "job_id", "action", "actor_kind", "actor_name", "changes", "note",
              "stream_id")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[ZSchedJobChange]:
        queryset: QuerySet[ZSchedJobChange] = super().get_queryset(request)
        return queryset.order_by("-at", "-id")

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[ZSchedJobChange],
                           search_term: str) -> tuple[QuerySet[ZSchedJobChange], bool]:
        found, duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        if term:
            found = found | queryset.filter(job_id=term)
        return found, duplicates

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        drain_quietly()
        response: HttpResponse = super().changelist_view(request, extra_context)
        return response

    @admin.display(description="changed fields")
    def changes(self, change: ZSchedJobChange) -> SafeString:
        return diff_html(change)

    @admin.display(description="note", ordering="note")
    def short_note(self, change: ZSchedJobChange) -> str:
        return str(Truncator(change.note).chars(80))
