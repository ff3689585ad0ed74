"""ZSchedJob <-> core Job, validation errors on the right form field, and the migrations."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime, timezone
from io import StringIO
from typing import Any

import django
import pytest
from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ImproperlyConfigured
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.management import call_command
from django.db import models

from celery_zsched.contrib.django.models import (
    CORE_TO_MODEL,
    DEFINITION_FIELDS,
    ActorKind,
    ChangeAction,
    DayRule,
    Transport,
    ZSchedJob,
    ZSchedRun,
)
from celery_zsched.contrib.django.models.choices import core_choices
from celery_zsched.core.audit import ACTIONS, ACTOR_KINDS
from celery_zsched.core.job import TRANSPORTS, Job, job_id_for_url
from celery_zsched.core.timing import DAY_RULES

pytestmark = pytest.mark.django_db


def _formfield(field: Any, **kwargs: Any) -> Any:
    # Django 5.x warns about URLField's scheme default unless one is chosen.
    if isinstance(field, models.URLField) and django.VERSION >= (5, 0):
        kwargs.setdefault("assume_scheme", "https")
    return field.formfield(**kwargs)


class JobForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        formfield_callback = _formfield
        model = ZSchedJob
        fields = ("job_id", "name", "task", "url", "interval_s", "cron", "timezone", "run_at",
                  "start_at", "end_at", "meta", "args", "kwargs", "priority")


class NarrowForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        formfield_callback = _formfield
        model = ZSchedJob
        fields = ("url", "interval_s")


def _form_errors(form_cls: type[forms.ModelForm], **data: Any  # type: ignore[type-arg]
                 ) -> dict[str, list[str]]:
    base = {"meta": "{}", "args": "[]", "kwargs": "{}"}
    form = form_cls(data={**base, **data})
    assert not form.is_valid()
    return {k: list(v) for k, v in form.errors.items()}


def test_makemigrations_check_finds_nothing_to_do() -> None:
    out = StringIO()
    call_command("makemigrations", "zsched", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_the_definition_fields_are_the_core_jobs_in_the_order_of_the_columns() -> None:
    core = [CORE_TO_MODEL.get(field.name, field.name) for field in dataclasses.fields(Job)]
    assert sorted(DEFINITION_FIELDS) == sorted(core)
    columns = [field.name for field in ZSchedJob._meta.concrete_fields]
    assert list(DEFINITION_FIELDS) == [name for name in columns if name in core]


def test_the_choices_are_the_core_lists_in_their_order() -> None:
    assert ChangeAction.values == list(ACTIONS)
    assert ActorKind.values == list(ACTOR_KINDS)
    assert Transport.values == list(TRANSPORTS)
    assert DayRule.values == list(DAY_RULES)
    assert ChangeAction.RUN_NOW == "run_now" and ChangeAction.RUN_NOW.label == "Run now"


def test_a_core_value_without_a_label_or_a_label_without_a_value_stops_the_app() -> None:
    with pytest.raises(ImproperlyConfigured, match="delete"):
        core_choices("Action", ("create", "delete"), {"create": "Created"}, "")
    with pytest.raises(ImproperlyConfigured, match="purge"):
        core_choices("Action", ("create",), {"create": "Created", "purge": "Purged"}, "")


def test_job_id_is_derived_from_the_url_on_save() -> None:
    row = ZSchedJob.objects.create(url="http://127.0.0.1:1/a", interval_s=10)
    assert row.job_id == job_id_for_url("http://127.0.0.1:1/a")
    assert row.kind == "interval"
    assert str(row) == f"{row.job_id} (http://127.0.0.1:1/a)"


def test_kind_follows_the_timing_fields() -> None:
    row = ZSchedJob.objects.create(job_id="c", task="t", cron="*/5 * * * *")
    assert row.kind == "cron"
    row.cron, row.run_at = "", datetime(2030, 1, 1, tzinfo=timezone.utc)
    row.save(update_fields=["cron", "run_at"])
    row.refresh_from_db()
    assert row.kind == "once"


def test_blank_time_zone_inherits_django_time_zone() -> None:
    row = ZSchedJob(job_id="c", task="t", cron="0 9 * * *")
    assert row.to_job().timezone == "Europe/Berlin"


def test_to_job_and_from_job_round_trip_every_field() -> None:
    job = Job.from_dict({
        "id": "full", "task": "tasks.fetch", "name": "Full", "url": "https://127.0.0.1:1/x",
        "meta": {"a": [1, 2]}, "args": [1, "b"], "kwargs": {"k": None}, "cron": "*/15 * * * *",
        "timezone": "America/New_York", "start_at": "2030-01-01T00:00:00Z",
        "end_at": "2031-01-01T00:00:00Z", "jitter_s": 1.5, "queue": "q", "routing_key": "rk",
        "priority": 7, "expires_s": 30, "enabled": False, "max_runs": 5,
        "misfire_grace_s": 60, "retry_max": 2, "retry_base_s": 10,
    })
    row = ZSchedJob.from_job(job)
    row.save()
    row.refresh_from_db()
    assert row.kind == "cron"
    assert row.to_job() == job


def test_once_job_round_trips_its_run_at() -> None:
    job = Job.from_dict({"id": "once", "task": "t", "run_at": "2030-05-01T09:30:00.250Z"})
    row = ZSchedJob.from_job(job)
    row.save()
    row.refresh_from_db()
    assert row.kind == "once" and row.to_job() == job


@pytest.mark.parametrize(("data", "field"), [
    ({"url": "http://127.0.0.1:1/a", "cron": "61 * * * *", "interval_s": ""}, "cron"),
    ({"url": "http://127.0.0.1:1/a", "timezone": "Mars/Olympus"}, "timezone"),
    ({"url": "http://127.0.0.1:1/a", "interval_s": "5", "cron": "* * * * *"}, "cron"),
    ({"url": "http://127.0.0.1:1/a", "interval_s": "0"}, "interval_s"),
    ({"job_id": "has space", "task": "t"}, "job_id"),
    ({"task": "t"}, "job_id"),
    ({"url": "http://127.0.0.1:1/a", "args": '{"not": "a list"}'}, "args"),
    ({"url": "http://127.0.0.1:1/a", "start_at": "2030-01-02T00:00",
      "end_at": "2030-01-01T00:00"}, "end_at"),
])
def test_core_validation_errors_show_on_the_form_field(data: dict[str, Any], field: str) -> None:
    errors = _form_errors(JobForm, **data)
    assert field in errors, errors
    assert NON_FIELD_ERRORS not in errors


def test_error_on_a_field_the_form_lacks_becomes_a_non_field_error() -> None:
    row = ZSchedJob.objects.create(job_id="x", task="t", interval_s=5)
    ZSchedJob.objects.filter(pk=row.pk).update(timezone="Mars/Olympus")
    row.refresh_from_db()
    form = NarrowForm(data={"url": "", "interval_s": "5"}, instance=row)
    assert not form.is_valid()
    assert "timezone" in form.errors[NON_FIELD_ERRORS][0]


def test_valid_form_saves_and_fills_the_id() -> None:
    form = JobForm(data={"url": "http://127.0.0.1:1/ok", "interval_s": "30", "meta": "{}",
                         "args": "[]", "kwargs": "{}"})
    assert form.is_valid(), form.errors
    with pytest.MonkeyPatch.context() as mp:
        # Redis is not the point here; the save must not need it either way.
        mp.setattr("celery_zsched.contrib.django.outbox.pushing.push", lambda *a, **k: True)
        row = form.save()
    assert row.job_id == job_id_for_url("http://127.0.0.1:1/ok")


def test_a_second_row_for_the_same_url_is_a_duplicate(make_row: Callable[..., ZSchedJob]
                                                       ) -> None:
    make_row(1)
    errors = _form_errors(JobForm, url="http://127.0.0.1:1/page/1", interval_s="60")
    assert "job_id" in errors


def test_full_clean_raises_the_mapped_error() -> None:
    with pytest.raises(DjangoValidationError) as info:
        ZSchedJob(url="ftp://127.0.0.1/x").full_clean()
    assert "url" in info.value.message_dict


def test_run_rows_keep_job_id_for_jobs_without_a_row(make_row: Callable[..., ZSchedJob]
                                                      ) -> None:
    row = make_row(1)
    ZSchedRun.objects.create(job_id=row.job_id, occurrence=1, status="complete",
                             finished_at=datetime.now(timezone.utc), stream_id="1-0")
    ZSchedRun.objects.create(job_id="static-entry", occurrence=1, status="complete",
                             finished_at=datetime.now(timezone.utc), stream_id="2-0")
    runs = {r.job_id: r for r in ZSchedRun.objects.select_related("job")}
    assert runs[row.job_id].job == row
    assert runs["static-entry"].job is None
    assert list(row.runs.values_list("stream_id", flat=True)) == ["1-0"]
    row.delete()
    assert list(ZSchedRun.objects.values_list("job_id", flat=True)) == ["static-entry"]
