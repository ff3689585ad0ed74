"""Property-based: any model row, any form post, validates or raises the validation error.

``ZSchedJob.full_clean()`` and ``save()`` (and the admin's ``ZSchedJobForm``)
never raise anything but a validation error, whatever the values of the
definition fields. A row that validates saves, and reads back as the same
job; a row that does not is not written. Deterministic regressions of each
crash are in ``test_dj_bad_input.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from hypothesis import event, given
from hypothesis import strategies as st

from celery_zsched.contrib.django.forms import ZSchedJobForm
from celery_zsched.contrib.django.models import DEFINITION_FIELDS, ZSchedJob
from celery_zsched.core.errors import ValidationError
from celery_zsched.core.job import Job
from tests.strategies import ANY_CHAR, FUZZ, ROWS, TEXT

pytestmark = pytest.mark.django_db


def _model_fields(data: dict[Any, Any]) -> dict[str, Any]:
    fields = {("job_id" if key == "id" else key): value for key, value in data.items()}
    return {k: v for k, v in fields.items() if k in DEFINITION_FIELDS}


def _floats(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats(v) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return value


def _as_stored(job: Job) -> Job:
    # PostgreSQL's jsonb keeps numbers as numeric: 3.4e16 reads back as the int
    # 34000000000000000. Equal as JSON numbers, which is all JSON promises.
    return dataclasses.replace(job, meta=_floats(job.meta), args=_floats(job.args),
                               kwargs=_floats(job.kwargs))


def _assert_sound(exc: DjangoValidationError) -> None:
    # Django's error for forms and the admin, the project's naming one field.
    assert isinstance(exc, ValidationError), type(exc)
    assert exc.message_dict
    assert isinstance(exc.field, str) and exc.field and exc.message
    assert len(str(exc)) < 2000


@FUZZ
@given(ROWS)
def test_any_model_row_validates_or_raises_the_validation_error(data: dict[Any, Any]) -> None:
    with transaction.atomic():
        row = ZSchedJob(**_model_fields(data))
        try:
            row.full_clean()
        except DjangoValidationError as exc:
            _assert_sound(exc)
            event(f"rejected: {sorted(exc.message_dict)[0]}")
            # save() validates too: it refuses the row instead of crashing or writing it.
            with pytest.raises(ValidationError) as refused:
                row.save()
            _assert_sound(refused.value)  # type: ignore[arg-type]
            assert not ZSchedJob.objects.exists()
        else:
            event("validated")
            job = row.to_job()
            row.save()
            row.refresh_from_db()
            assert _as_stored(row.to_job()) == _as_stored(job)  # validated = stored
        transaction.set_rollback(True)


@FUZZ
@given(ROWS)
def test_save_without_full_clean_validates_or_raises_the_validation_error(
        data: dict[Any, Any]) -> None:
    """The unvalidated instance of a shell or a script: never IntegrityError, OverflowError."""
    with transaction.atomic():
        row = ZSchedJob(**_model_fields(data))
        try:
            row.save()
        except DjangoValidationError as exc:
            _assert_sound(exc)
            event("refused")
        else:
            event("saved")
            row.refresh_from_db()
            row.to_job()
        transaction.set_rollback(True)


#: Text in every field, as a form gets it (lone surrogates too: a form is not
#: only fed by browsers).
FORM_TEXT = st.one_of(TEXT, st.text(ANY_CHAR, max_size=20))
FORM_FIELDS = [f for f in DEFINITION_FIELDS if f not in ("meta", "args", "kwargs")]
FORM_JSON = st.one_of(st.sampled_from(["", "{}", "[]", "null", '"s"', "NaN", '{"a": Infinity}',
                                       '{"a": "\\ud800"}', '{"a": "\\u0000"}']),
                      st.integers(1, 100_000).map(lambda n: "[" * n + "]" * n),
                      st.integers(4301, 6000).map(lambda n: "[" + "9" * n + "]"), FORM_TEXT)


@FUZZ
@given(st.fixed_dictionaries({}, optional={
    **{name: FORM_TEXT for name in FORM_FIELDS},
    **{name: FORM_JSON for name in ("meta", "args", "kwargs")}}))
def test_any_form_post_is_valid_or_shows_errors(data: dict[str, str]) -> None:
    with transaction.atomic():
        form = ZSchedJobForm(data=data)
        if form.is_valid():
            event("valid")
            form.save()
        else:
            event("errors")
            assert form.errors
        form.as_p()  # the form with its errors renders, as the admin would show it
        transaction.set_rollback(True)
