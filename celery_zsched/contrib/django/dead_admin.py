"""The "Dead letters" page of the admin: jobs whose worker died ``max_deliveries``
times in a row, read live from Redis, with requeue and purge actions.

Dead letters live in Redis only (the ``dead`` sorted set), so this is a plain
admin view under the job admin's URLs (``.../zschedjob/dead-letters/``),
guarded by its permissions like the Domains pages: who may view jobs sees
the list, who may change jobs may act on it (403 otherwise).

Each action is one :class:`Store` call over the selected ids (one pipeline,
grouped by partition), then the ``enabled`` column of their rows follows,
recorded in the outbox (:mod:`.outbox`) in the same transaction: requeue
unpauses, purge pauses. Without that update the next ``zsched_sync`` would see
the row disagree with Redis and push the row's ``enabled`` back, undoing a purge.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import router, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from celery_zsched.contrib.django import outbox
from celery_zsched.contrib.django.audit import admin_actor, request_note
from celery_zsched.contrib.django.conf import get_store
from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.core.errors import StoreUnavailable, ValidationError
from celery_zsched.store import dead
from celery_zsched.store.dead import DeadLetter

#: Newest dead letters shown (and selectable) on the page; the CLI's
#: ``zsched dead requeue --all`` acts on any number.
PER_PAGE = 200
#: action -> (Store method, past tense for the message, DB columns to set).
ACTIONS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "requeue": ("requeue_dead", "Requeued", {"enabled": True, "consecutive_failures": 0}),
    "purge": ("purge_dead", "Purged (jobs kept, paused)", {"enabled": False}),
}


#: The change each action makes to the rows, as the outbox records it.
_ROW_ACTION = {"requeue": "resume", "purge": "pause"}


class DeadLetterAdminViews:
    """The list view and its actions, bound to the job admin whose permissions they use."""

    def __init__(self, model_admin: Any) -> None:
        self.model_admin = model_admin
        self.site = model_admin.admin_site
        self.opts = model_admin.model._meta

    def urls(self) -> list[URLPattern]:
        return [path("dead-letters/", self.site.admin_view(self.list_view),
                     name=f"{self.opts.app_label}_dead_letters")]

    def url(self) -> str:
        return reverse(f"{self.site.name}:{self.opts.app_label}_dead_letters")

    def list_view(self, request: HttpRequest) -> HttpResponse:
        if not self.model_admin.has_view_or_change_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            if not self.model_admin.has_change_permission(request):
                raise PermissionDenied
            self._act(request)
            return HttpResponseRedirect(self.url())  # no resubmission on reload
        letters: list[DeadLetter] = []
        total, now, error = 0, 0, ""
        try:
            store = get_store()
            letters, total, now = dead.latest(store, PER_PAGE), dead.count(store), store.now_ms()
        except StoreUnavailable as exc:
            error = str(exc)
        context = {
            **self.site.each_context(request), "title": "Dead letters", "opts": self.opts,
            "has_change_permission": self.model_admin.has_change_permission(request),
            "rows": self._rows(letters, now), "total": total, "error": error,
            "actions": [(name, label) for name, (_, label, _) in ACTIONS.items()],
        }
        return TemplateResponse(request, "admin/zsched/dead/change_list.html", context)

    def _rows(self, letters: list[DeadLetter], now: int) -> list[dict[str, Any]]:
        # One query links the jobs that have a row to their change pages.
        pks = dict(ZSchedJob.objects.filter(job_id__in=[d.job_id for d in letters])
                   .values_list("job_id", "pk")) if letters else {}
        name = f"{self.site.name}:{self.opts.app_label}_{self.opts.model_name}_change"
        return [{
            "id": d.job_id, "target": d.target, "task": d.task,
            "died": dead.iso(d.died_ms), "ago": dead.ago(d.died_ms, now),
            "deliveries": d.deliveries, "error": d.last_error,
            "short_error": dead.short(d.last_error),
            "change_url": reverse(name, args=[pks[d.job_id]]) if d.job_id in pks else "",
        } for d in letters]

    def _act(self, request: HttpRequest) -> None:
        action = request.POST.get("action", "")
        ids = list(dict.fromkeys(request.POST.getlist("_selected_action")))
        if action not in ACTIONS:
            messages.error(request, "Choose an action.")
            return
        if not ids:
            messages.warning(request, "Select dead letters to act on; nothing changed.")
            return
        method, past, columns = ACTIONS[action]
        try:
            note = request_note(request)
            # Redis first: if it is down nothing changes, the database included.
            changed = getattr(get_store(), method)(*ids, by=admin_actor(request), note=note)
        except (StoreUnavailable, ValidationError) as exc:
            messages.error(request, f"Nothing changed: {exc}")
            return
        # The rows follow (enabled), recorded in the outbox like every change of a
        # row: their versioned push after the commit finds Redis already so.
        by, using = admin_actor(request), router.db_for_write(ZSchedJob)
        with transaction.atomic(using=using):
            changed_ids, version = outbox.write_rows(ids, columns, _ROW_ACTION[action],
                                                     using=using, by=by)
            outbox.push_after_commit([outbox.Change(job_id, version, _ROW_ACTION[action], by=by)
                                      for job_id in changed_ids], using=using)
        skipped = len(ids) - changed
        note = f" ({skipped} no longer dead-lettered, left alone)" if skipped else ""
        messages.success(request, f"{past} {changed} dead letter{'' if changed == 1 else 's'}"
                         f"{note}.")
