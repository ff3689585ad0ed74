"""The "Domains" pages of the admin: per-domain pacing, read from and written to Redis.

Domains have no database table: their state and overrides live in Redis
only, where beat's claim reads them. So these are plain admin views, added
to the job admin's URLs (``.../zschedjob/domains/``) and guarded by its
permissions: who may view jobs may view domains, who may change jobs may
change how fast they go. Every edit goes straight to
:meth:`Store.set_domain` / :meth:`Store.reset_domain`; nothing is cached.
"""

from __future__ import annotations

import math
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from celery_zsched.contrib.django.conf import get_store
from celery_zsched.core import domain_table
from celery_zsched.core.domains import DomainInfo, normalise_domain
from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.core.planner import DomainPlan
from celery_zsched.services import planner
from celery_zsched.store import Store

#: Domains per page of the list (each is one row of plain cells).
PER_PAGE = 200
#: Store argument of each form field (the form's names are the store's).
FIELDS = ("delay_s", "max_in_flight", "adaptive")


class DomainForm(forms.Form):
    """One domain's override. Only the fields the operator changed are written, so
    a field left alone keeps following its ``zsched_domain_*`` default."""

    delay_s = forms.FloatField(
        label="Delay (seconds)", min_value=0,
        help_text="Least time between the starts of two requests to this domain.")
    max_in_flight = forms.IntegerField(
        label="Max in flight", min_value=0,
        help_text="Most requests to this domain at once; 0 is unlimited.")
    adaptive = forms.BooleanField(
        label="Adaptive", required=False,
        help_text="Raise the delay on 429 answers, lower it again on successes.")

    def clean_delay_s(self) -> float:
        value: float = self.cleaned_data["delay_s"]
        # Django rejects nan and inf already; say it again for older releases.
        if not math.isfinite(value):
            raise forms.ValidationError("Enter a finite number of seconds.")
        return value

    @classmethod
    def initial_of(cls, info: DomainInfo) -> dict[str, Any]:
        """The configured values: ``base_delay_s``, not the adaptive delay in force."""
        return {"delay_s": info.base_delay_s, "max_in_flight": info.max_in_flight,
                "adaptive": info.adaptive}


def _cells(info: DomainInfo, plan: DomainPlan | None = None) -> dict[str, Any]:
    # The same cells as `zsched domains`, keyed for the templates.
    names = ("name", "delay", "delay_source", "cap", "breaker", "closed_until", "last_429",
             "completed", "failed", "throttled_429", "held", "override", "demand", "lateness")
    cells: dict[str, Any] = dict(zip(names, domain_table.row(info, plan), strict=True))
    cells["oversubscribed"] = plan is not None and plan.oversubscribed
    return cells


class DomainAdminViews:
    """The list, change and reset views, bound to the job admin whose permissions they use."""

    def __init__(self, model_admin: Any) -> None:
        self.model_admin = model_admin
        self.site = model_admin.admin_site
        self.opts = model_admin.model._meta

    def urls(self) -> list[URLPattern]:
        wrap = self.site.admin_view
        label = self.opts.app_label
        return [
            path("domains/", wrap(self.list_view), name=f"{label}_domains"),
            path("domains/<str:host>/", wrap(self.change_view), name=f"{label}_domain_change"),
            path("domains/<str:host>/reset/", wrap(self.reset_view),
                 name=f"{label}_domain_reset"),
        ]

    def url(self, name: str, *args: str) -> str:
        return reverse(f"{self.site.name}:{self.opts.app_label}_{name}", args=args)

    # --------------------------------------------------------------- helpers
    def _context(self, request: HttpRequest, title: str, store: Store | None,
                 **extra: Any) -> dict[str, Any]:
        return {
            **self.site.each_context(request), "title": title, "opts": self.opts,
            "has_change_permission": self.model_admin.has_change_permission(request),
            "domains_url": self.url("domains"),
            # Off, nothing is paced: say so, or edits would seem to do nothing.
            "pacing_off": store is not None and not store.settings.pacing,
            **extra,
        }

    def _check_view(self, request: HttpRequest) -> None:
        if not self.model_admin.has_view_or_change_permission(request):
            raise PermissionDenied

    def _check_change(self, request: HttpRequest) -> None:
        if not self.model_admin.has_change_permission(request):
            raise PermissionDenied

    def _host(self, host: str) -> str:
        try:
            return normalise_domain(host)
        except ValueError as exc:
            raise Http404(str(exc)) from None

    # ----------------------------------------------------------------- views
    def list_view(self, request: HttpRequest) -> HttpResponse:
        self._check_view(request)
        query = request.GET.get("q", "").strip()
        store: Store | None = None
        error = ""
        infos: list[DomainInfo] = []
        plans: dict[str, DomainPlan] = {}
        try:
            store = get_store()
            infos, plans, _demand = planner.domain_plans(store)
        except StoreUnavailable as exc:
            error = str(exc)
        if query:
            needle = query.lower()
            infos = [i for i in infos if needle in i.name]
        if request.GET.get("over"):
            infos = [i for i in infos if i.name in plans and plans[i.name].oversubscribed]
        page = Paginator(infos, PER_PAGE).get_page(request.GET.get("p"))
        rows = [(_cells(info, plans.get(info.name)), self.url("domain_change", info.name),
                 self.url("domain_reset", info.name)) for info in page]
        context = self._context(
            request, "Domains", store, rows=rows, page=page, query=query, error=error,
            open_url=self._open_url(query, infos), headers=domain_table.HEADERS)
        return TemplateResponse(request, "admin/zsched/domains/change_list.html", context)

    def _open_url(self, query: str, shown: list[DomainInfo]) -> str:
        # A searched host without state yet can still be given an override.
        try:
            host = normalise_domain(query) if query else ""
        except ValueError:
            return ""
        if not host or any(info.name == host for info in shown):
            return ""
        return self.url("domain_change", host)

    def change_view(self, request: HttpRequest, host: str) -> HttpResponse:
        self._check_view(request)
        name = self._host(host)
        if name != host:  # one page per domain, at its canonical name
            return HttpResponseRedirect(self.url("domain_change", name))
        try:
            store = get_store()
            info = store.domain(name)
            _infos, plans, _demand = planner.domain_plans(store, [info])
        except StoreUnavailable as exc:
            context = self._context(request, f"Domain {name}", None, error=str(exc), name=name)
            return TemplateResponse(request, "admin/zsched/domains/change_form.html", context)
        form = DomainForm(initial=DomainForm.initial_of(info))
        if request.method == "POST":
            self._check_change(request)
            form = DomainForm(request.POST, initial=DomainForm.initial_of(info))
            if form.is_valid() and self._save(request, store, name, form):
                return HttpResponseRedirect(self.url("domain_change", name))
        if not self.model_admin.has_change_permission(request):
            for field in form.fields.values():
                field.disabled = True  # viewers see the values, greyed out
        context = self._context(
            request, f"Domain {name}", store, name=name, form=form,
            cells=_cells(info, plans.get(name)),
            headers=domain_table.HEADERS, reset_url=self.url("domain_reset", name),
            has_override=info.overridden)
        return TemplateResponse(request, "admin/zsched/domains/change_form.html", context)

    def _save(self, request: HttpRequest, store: Store, name: str, form: DomainForm) -> bool:
        """Write the changed fields; ``False`` (with an error on the form) if nothing was."""
        changes = {field: form.cleaned_data[field] for field in FIELDS
                   if field in form.changed_data}
        if not changes:
            messages.info(request, f"Nothing changed for {name}.")
            return True
        try:
            info = store.set_domain(name, **changes)
        except StoreUnavailable as exc:
            form.add_error(None, f"Nothing changed: {exc}")
            return False
        except ValueError as exc:  # the store's own checks
            field = getattr(exc, "field", None)
            form.add_error(field if field in FIELDS else None, str(exc))
            return False
        messages.success(request, f"Saved {name}: delay {domain_table.seconds(info.base_delay_s)}"
                         f", max in flight {info.max_in_flight or 'unlimited'}, "
                         f"{'adaptive' if info.adaptive else 'fixed delay'}.")
        return True

    def reset_view(self, request: HttpRequest, host: str) -> HttpResponse:
        # Resetting throws away what the domain learned: only by POST (CSRF-checked).
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        self._check_change(request)
        name = self._host(host)
        try:
            changed = get_store().reset_domain(name)
        except StoreUnavailable as exc:
            messages.error(request, f"Nothing changed: {exc}")
            return HttpResponseRedirect(self.url("domain_change", name))
        if changed:
            messages.success(request, f"Reset {name}: its override and learned state are gone.")
        else:
            messages.info(request, f"{name} had nothing to reset.")
        return HttpResponseRedirect(self.url("domains"))
