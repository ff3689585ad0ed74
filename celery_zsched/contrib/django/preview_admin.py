"""The next fire times in the job admin: a table on the change page, and a JSON
endpoint the add and change forms call as the timing fields are edited.

The endpoint (``.../zschedjob/preview/?cron=...&timezone=...``) validates the
timing with :meth:`Job.from_dict`, as saving would, and answers the fires of
:mod:`celery_zsched.services.preview` and the timing in plain words, or the field
errors. It reads the local clock, not Redis: a form being typed into should
not need the store, and a preview of unsaved timing has no stored due time to
read anyway. Guarded by the job admin's view permission, as the Domains pages
are.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone as dj_timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from celery_zsched.contrib.django.conf import get_defaults, get_settings
from celery_zsched.contrib.django.models import model_field_for
from celery_zsched.contrib.django.words import job_in_words
from celery_zsched.core.errors import ValidationError
from celery_zsched.core.job import Job
from celery_zsched.services.preview import Preview, preview

#: Fires the change page and the live preview show.
COUNT = 10
#: Query parameters the endpoint reads: the form fields that move the fire times.
FIELDS = ("cron", "timezone", "interval_s", "day_rule", "jitter_s", "max_runs", "run_at",
          "start_at", "end_at")
#: Of those, the date-times (their split widgets post a date and a time).
TIME_FIELDS = ("run_at", "start_at", "end_at")


def _as_form_reads(text: str) -> str:
    """A naive ISO time as the admin form reads it: in ``TIME_ZONE``, not the job's zone."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return text  # Job.from_dict names the field and says what it expects
    if dj_timezone.is_naive(value):
        value = dj_timezone.make_aware(value)
    return value.isoformat()


def url_name(model_admin: Any) -> str:
    opts = model_admin.model._meta
    return f"{opts.app_label}_{opts.model_name}_preview"


def preview_url(model_admin: Any) -> str:
    return reverse(f"{model_admin.admin_site.name}:{url_name(model_admin)}")


def urls(model_admin: Any) -> list[URLPattern]:
    """The endpoint, bound to ``model_admin`` (whose permissions guard it)."""
    def view(request: HttpRequest) -> HttpResponse:
        if not model_admin.has_view_or_change_permission(request):
            raise PermissionDenied
        return preview_json(request)

    return [path("preview/", model_admin.admin_site.admin_view(view),
                 name=url_name(model_admin))]


def preview_json(request: HttpRequest) -> JsonResponse:
    """Fires and plain words of the timing in the query string, or
    ``{"errors": {field: [message]}}``."""
    data: dict[str, Any] = {"id": "preview", "task": "preview"}
    data.update({k: v for k in FIELDS if (v := request.GET.get(k, "").strip())})
    for name in TIME_FIELDS:
        if name in data:
            data[name] = _as_form_reads(data[name])
    try:
        job = Job.from_dict(data, get_defaults())
    except ValidationError as exc:
        return JsonResponse({"errors": {model_field_for(exc.field): [exc.message]}},
                            status=400)
    result = preview(job, int(time.time() * 1000), COUNT, get_settings())
    return JsonResponse({"timezone": job.timezone, "words": job_in_words(job),
                         **result.to_dict()})


def fires_html(result: Preview, url: str) -> SafeString:
    """The table the change page shows; the live preview (JavaScript) replaces it."""
    rows = format_html_join(
        "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        ((f.local.strftime("%Y-%m-%d %H:%M:%S %Z"), f.utc.strftime("%Y-%m-%d %H:%M:%SZ"),
          f"+0..{f.jitter_ms / 1000:g} s" if f.jitter_ms else "-", f.dst_note)
         for f in result.fires))
    table = (format_html('<table><thead><tr><th>Local</th><th>UTC</th><th>Jitter</th>'
                         '<th></th></tr></thead><tbody>{}</tbody></table>', rows)
             if result.fires else "")
    note = format_html("<p>{}</p>", result.note) if result.note else ""
    return format_html('<div id="zsched-next-fires" data-url="{}">{}{}</div>', url, table,
                       note)
