"""Bad values never crash the model, its save() or the admin form (invariant 8).

One regression test per crash the fuzzer found in ``full_clean()`` and
``save()``. Each bad value is reported as a validation error naming its
field: :class:`django.core.exceptions.ValidationError` for Django (forms,
the admin) that is at the same time :class:`celery_zsched.ValidationError`
(with ``.field``, ``.value`` and ``.message``), like every other entry point.
The property-based twin of this module is ``test_dj_bad_input_fuzz.py``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from django.test import Client
from django.urls import reverse

from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.core.errors import ValidationError, show_value

pytestmark = pytest.mark.django_db

BASE: dict[str, Any] = {"job_id": "job-1", "task": "tests.noop"}
DEEP = 100_000


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def _id(value: Any) -> str:
    # Short ids: they land in PYTEST_CURRENT_TEST, and repr() of DEEP recurses too far.
    text = value if isinstance(value, str) else show_value(value)
    return text if len(text) <= 24 else f"{text[:16]}...({len(text)})"


# (field, value): each crashed full_clean() or save() with something other
# than a validation error, or (with save) wrote a row Redis could not follow.
CRASHES: list[tuple[str, Any]] = [
    ("run_at", -1e20),                 # TypeError from fromisoformat
    ("end_at", {"$ref": "x"}),          # TypeError from fromisoformat
    ("start_at", "next tuesday"),       # 'str' object has no attribute 'utcoffset'
    ("run_at", "0001-01-01T00:00:00"),  # before 1970 once in UTC
    ("kwargs", None),                   # IntegrityError (NOT NULL) in save()
    ("meta", None),
    ("job_id", None),                   # IntegrityError (NOT NULL); found by the fuzzer
    ("name", None),
    ("jitter_s", ""),                   # ValueError in save(): a str in a number column
    ("run_at", ""),
    ("jitter_s", 1e308),                # OverflowError on the way to Redis
    ("interval_s", 10**400),            # OverflowError in FloatField.to_python
    ("priority", float("inf")),         # OverflowError in IntegerField.to_python
    ("max_runs", 2**63),                # OverflowError from sqlite3 in save()
    ("retry_max", 10**400),
    ("misfire_grace_s", float("nan")),
    ("meta", {"a": _nested(DEEP)}),     # RecursionError in JSONField.validate
    ("args", [float("inf")]),           # Infinity: no JSON, and jsonb refuses it
    ("kwargs", {"k": "\ud800"}),        # a lone surrogate: UnicodeEncodeError in save()
    ("name", "caf\udce9"),
    ("name", "n" * 100_000),
    ("url", "http://[::1"),             # ValueError: Invalid IPv6 URL
    ("url", 5),
    ("timezone", "Europe"),             # IsADirectoryError from ZoneInfo
    ("cron", ["0", "9"]),
    ("enabled", "maybe"),
    ("queue", "q\x00"),                  # NUL: PostgreSQL refuses it
    ("jitter_s", [10**4301]),           # Django's own message: str() of the value raises
    ("interval_s", "x" * 1_000_000),    # Django's own message: a megabyte long
]


@pytest.mark.parametrize(("field", "value"), CRASHES, ids=_id)
def test_full_clean_reports_each_crash_as_an_error_on_its_field(field: str, value: Any) -> None:
    row = ZSchedJob(**{**BASE, field: value})
    with pytest.raises(DjangoValidationError) as caught:
        row.full_clean()
    assert field in caught.value.message_dict, caught.value.message_dict
    # The same error is the project's own, naming the field.
    assert isinstance(caught.value, ValidationError)
    assert caught.value.field == ("id" if field == "job_id" else field)
    assert len(str(caught.value)) < 2000


@pytest.mark.parametrize(("field", "value"), CRASHES, ids=_id)
def test_save_of_an_unvalidated_bad_row_raises_the_validation_error(field: str,
                                                                    value: Any) -> None:
    """save() runs the same validation: never IntegrityError, OverflowError or a bad row."""
    row = ZSchedJob(**{**BASE, field: value})
    with pytest.raises(ValidationError) as caught:
        row.save()
    assert isinstance(caught.value, DjangoValidationError)
    assert field in caught.value.message_dict
    assert not ZSchedJob.objects.exists()


def test_none_means_not_given_and_blank_text_is_empty() -> None:
    row = ZSchedJob(**BASE, interval_s=None, jitter_s=None, priority=None, run_at=None,
                    queue="", cron="")
    row.full_clean()
    row.save()
    row.refresh_from_db()
    assert (row.interval_s, row.jitter_s, row.priority, row.kind) == (None, None, None,
                                                                      "interval")


def test_save_validates_and_converts_like_full_clean() -> None:
    """Strings a form would send are converted, then stored."""
    row = ZSchedJob(**BASE, interval_s="30", start_at="2030-01-01T00:00:00Z", meta='{"a": 1}')
    row.save()
    row.refresh_from_db()
    assert row.interval_s == 30.0
    assert row.start_at == datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert row.meta == {"a": 1}


def test_a_mirror_only_save_does_not_validate_the_definition() -> None:
    """drain and reconcile update the runtime mirror of rows even if someone broke them."""
    row = ZSchedJob.objects.create(**BASE, interval_s=30)
    ZSchedJob.objects.filter(pk=row.pk).update(cron="not cron")
    row.refresh_from_db()
    row.last_status = "complete"
    row.save(update_fields=["last_status"])
    assert ZSchedJob.objects.get(pk=row.pk).last_status == "complete"


def test_a_duplicate_id_is_a_validation_error_on_save() -> None:
    ZSchedJob.objects.create(**BASE, interval_s=30)
    with pytest.raises(ValidationError) as caught:
        ZSchedJob(**BASE, interval_s=60).save()
    assert "job_id" in caught.value.message_dict  # type: ignore[attr-defined]
    assert not isinstance(caught.value, IntegrityError)


def test_a_lone_surrogate_in_the_id_never_reaches_the_uniqueness_query() -> None:
    """Another field failing first left job_id to validate_unique(): UnicodeEncodeError."""
    row = ZSchedJob(job_id="a\udcff", task="t", timezone="0")
    with pytest.raises(DjangoValidationError) as caught:
        row.full_clean()
    assert {"job_id", "timezone"} <= set(caught.value.message_dict)
    from celery_zsched.contrib.django.forms import ZSchedJobForm

    form = ZSchedJobForm(data={**FORM_BASE, "job_id": "a\udcff", "timezone": "0"})
    assert not form.is_valid()
    assert {"job_id", "timezone"} <= set(form.errors)


def test_clean_alone_never_crashes_on_raw_values() -> None:
    """clean() (not only full_clean()) sees values no field has converted yet."""
    for field, value in CRASHES:
        try:
            ZSchedJob(**{**BASE, field: value}).clean()
        except DjangoValidationError as exc:
            assert field in exc.message_dict


# --------------------------------------------------------------- forms
FORM_BASE = {"job_id": "f-1", "task": "t", "meta": "{}", "args": "[]", "kwargs": "{}",
             "day_rule": "or", "enabled": "on"}


@pytest.mark.parametrize(("field", "text"), [
    ("meta", "[" * DEEP + "]" * DEEP),      # RecursionError in forms.JSONField
    ("args", "[" + "9" * 5000 + "]"),       # ValueError: Exceeds the limit (4300 digits)
    ("kwargs", '{"a": NaN}'),
    ("meta", '{"a": "\\ud800"}'),
    ("interval_s", "1" + "0" * 400),
    ("priority", "9" * 5000),
    ("run_at", "99999-01-01T00:00"),
    ("url", "http://[::1"),
    ("timezone", "Europe"),
], ids=_id)
def test_the_model_form_shows_each_bad_value_on_its_field(field: str, text: str) -> None:
    from celery_zsched.contrib.django.forms import ZSchedJobForm

    form = ZSchedJobForm(data={**FORM_BASE, field: text})
    assert not form.is_valid()
    assert field in form.errors, form.errors
    form.as_p()  # rendering the bound, invalid form must not crash either


def _admin_data(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "", "url": "", "task": "t", "job_id": "a-1", "enabled": "on",
        "interval_s": "", "cron": "", "timezone": "", "day_rule": "or",
        "run_at_0": "", "run_at_1": "", "jitter_s": "", "start_at_0": "", "start_at_1": "",
        "end_at_0": "", "end_at_1": "", "max_runs": "", "misfire_grace_s": "",
        "meta": "{}", "args": "[]", "kwargs": "{}", "queue": "", "routing_key": "",
        "priority": "", "expires_s": "", "retry_max": "", "retry_base_s": "",
        "runs-TOTAL_FORMS": "0", "runs-INITIAL_FORMS": "0",
        "runs-MIN_NUM_FORMS": "0", "runs-MAX_NUM_FORMS": "0",
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize(("field", "overrides"), [
    ("meta", {"meta": "[" * DEEP + "]" * DEEP}),
    ("args", {"args": "[" + "9" * 5000 + "]"}),
    ("kwargs", {"kwargs": '{"a": Infinity}'}),
    ("jitter_s", {"jitter_s": "1e308"}),
    ("max_runs", {"max_runs": "99999999999999999999"}),
    ("url", {"url": "http://[::1"}),
    ("timezone", {"timezone": "Europe", "cron": "0 9 * * *"}),
    ("run_at", {"run_at_0": "0001-01-01", "run_at_1": "00:00:00"}),
    ("name", {"name": "n" * 5000}),
], ids=_id)
def test_the_admin_shows_each_bad_value_on_its_field(admin_client: Client, field: str,
                                                     overrides: dict[str, Any]) -> None:
    response = admin_client.post(reverse("admin:zsched_zschedjob_add"), _admin_data(**overrides))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert field in errors, errors
    assert not ZSchedJob.objects.exists()


@pytest.mark.parametrize(("field", "value"), [("meta", ""), ("job_id", None)])
def test_a_failed_full_clean_changes_nothing_that_save_could_then_store(field: str,
                                                                        value: Any) -> None:
    """Found by the fuzzer: clean() turned ``meta=""`` into ``{}`` (and derived the
    id for ``job_id=None``) while full_clean() failed on that very field, so the
    following save() passed and stored the row."""
    row = ZSchedJob(url="https://example.com/", **{field: value})
    with pytest.raises(ValidationError):
        row.full_clean()
    assert getattr(row, field) == value
    with pytest.raises(ValidationError):
        row.save()
    assert not ZSchedJob.objects.exists()


@pytest.mark.parametrize(("text", "message"), [
    ('[\n{"url": "https://example.com/1"},\n' + "[" * DEEP + "]" * DEEP + "\n]",
     "file: malformed JSON at line 3: nested too deeply"),
    ('[\n{"url": "http://[::1"},\n{"id": "b", "task": "t", "interval_s": 1' + "0" * 400
     + '},\n{"id": "c", "task": "t", "cron": "0 9 * * *", "timezone": "Europe"}\n]',
     "job 1 (url 'http://[::1'): url: must be an absolute http(s) URL"),
], ids=["deep", "rows"])
def test_zsched_import_reports_each_crash_as_a_command_error(tmp_path: Any, text: str,
                                                             message: str) -> None:
    """manage.py zsched_import reads files with the same importer: no traceback, no row."""
    from django.core.management import CommandError, call_command

    path = tmp_path / "jobs.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CommandError) as caught:
        call_command("zsched_import", "--file", str(path))
    assert message in str(caught.value)
    assert not ZSchedJob.objects.exists()
