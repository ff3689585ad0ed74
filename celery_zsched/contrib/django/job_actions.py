"""The job admin's actions: pause, resume, run now and reset failures.

Over the rows selected in the list (the action menu, :data:`ACTIONS`) or over
one row (the buttons of its change page, :meth:`JobActions.urls`). Each is one
:func:`.operations.apply_operation` (one :class:`Store` call over every id, at
most one SQL ``UPDATE``), reported to the user as an admin message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse
from django.views.decorators.http import require_POST

from celery_zsched.contrib.django.audit import admin_actor, request_note
from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.contrib.django.operations import OPERATIONS, apply_operation
from celery_zsched.contrib.django.words import counted
from celery_zsched.core.errors import JobNotFound, StoreUnavailable


class JobActions:
    """The operations of a job admin, reported to its user, and its change page's buttons."""

    def __init__(self, model_admin: Any) -> None:
        self.model_admin = model_admin
        self.site = model_admin.admin_site
        self.opts = model_admin.model._meta

    def run(self, request: HttpRequest, operation: str, queryset: QuerySet[ZSchedJob]) -> bool:
        """Apply ``operation`` and report it as an admin message; False on failure."""
        message_user = self.model_admin.message_user
        try:
            note = request_note(request)
        except ValueError as exc:
            message_user(request, f"Nothing changed: {exc}", messages.ERROR)
            return False
        try:
            result = apply_operation(operation, queryset, by=admin_actor(request), note=note)
        except JobNotFound as exc:
            message_user(request, f"{exc}: it is not in Redis yet; run "
                         "manage.py zsched_sync to push it.", messages.ERROR)
            return False
        except StoreUnavailable as exc:
            message_user(request, f"Nothing changed: {exc}", messages.ERROR)
            return False
        past = OPERATIONS[operation][1]
        noun = "job" if result.rows == 1 else "jobs"
        message_user(request, f"{past} {result.rows} {noun} ({result.changed} changed in "
                     f"Redis, {result.seconds * 1000:.0f} ms).", messages.SUCCESS)
        if result.pending:
            message_user(request, f"{counted(result.pending, 'job')} saved but not in Redis "
                         "yet: the change waits in the outbox and reaches beat within "
                         "seconds of Redis being reachable.", messages.WARNING)
        return True

    def _url_name(self, operation: str) -> str:
        return f"{self.opts.app_label}_{self.opts.model_name}_{operation}"

    def urls(self) -> list[URLPattern]:
        """One POST-only URL per operation under a job's own: ``<id>/run-now/``."""
        return [
            path(f"<path:object_id>/{op.replace('_', '-')}/",
                 self.site.admin_view(self._button_view(op)), name=self._url_name(op))
            for op in OPERATIONS
        ]

    def buttons(self, row: ZSchedJob) -> list[tuple[str, str]]:
        """The change page's buttons of ``row``: (URL, label)."""
        return [
            (reverse(f"{self.site.name}:{self._url_name(op)}", args=[row.pk]), label)
            for op, label in (("resume", "Resume") if not row.enabled else ("pause", "Pause"),
                              ("run_now", "Run now"), ("reset_failures", "Reset failures"))
        ]

    def _button_view(self, operation: str) -> Callable[..., HttpResponse]:
        @require_POST  # type: ignore[untyped-decorator, unused-ignore]
        def view(request: HttpRequest, object_id: str) -> HttpResponse:
            row = get_object_or_404(ZSchedJob, pk=object_id)
            if not self.model_admin.has_change_permission(request, row):
                raise PermissionDenied
            self.run(request, operation, ZSchedJob.objects.filter(pk=row.pk))
            return HttpResponseRedirect(reverse(
                f"{self.site.name}:{self._url_name('change')}", args=[row.pk]))

        handler: Callable[..., HttpResponse] = view
        return handler


def _make_action(operation: str, description: str) -> Callable[..., None]:
    def action(modeladmin: Any, request: HttpRequest, queryset: QuerySet[ZSchedJob]) -> None:
        JobActions(modeladmin).run(request, operation, queryset)

    action.__name__ = f"{operation}_jobs"
    decorated: Callable[..., None] = admin.action(
        description=description, permissions=("change",))(action)
    return decorated


#: The job list's action menu (over every selected row: "select all 100,000" stays fast).
ACTIONS: tuple[Callable[..., None], ...] = (
    _make_action("pause", "Pause selected jobs"),
    _make_action("resume", "Resume selected jobs"),
    _make_action("run_now", "Run selected jobs now"),
    _make_action("reset_failures", "Reset failures of selected jobs"),
)
