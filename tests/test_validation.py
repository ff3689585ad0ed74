"""Bad input is rejected with the field and row named, and nothing is written (invariant 8)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery

from celery_zsched.beat.scheduler import ZSchedScheduler
from celery_zsched.config import Settings
from celery_zsched.core.errors import ConfigurationError, ValidationError
from celery_zsched.core.job import Job

BASE: dict[str, Any] = {"id": "job-1", "task": "tests.noop"}

BAD_ROWS: list[tuple[str, dict[str, Any], str]] = [
    ("invalid cron", {**BASE, "cron": "61 * * * *"}, "cron"),
    ("cron with too few fields", {**BASE, "cron": "* * *"}, "cron"),
    ("cron that is not text", {**BASE, "cron": 5}, "cron"),
    ("negative interval", {**BASE, "interval_s": -5}, "interval_s"),
    ("zero interval", {**BASE, "interval_s": 0}, "interval_s"),
    ("interval that is not a number", {**BASE, "interval_s": "often"}, "interval_s"),
    ("infinite interval", {**BASE, "interval_s": float("inf")}, "interval_s"),
    ("unknown time zone", {**BASE, "cron": "0 * * * *", "timezone": "Mars/Olympus"},
     "timezone"),
    ("url without scheme", {"url": "example.com/page"}, "url"),
    ("url of another scheme", {"url": "ftp://example.com/file"}, "url"),
    ("url with a space", {"url": "https://example.com/a page"}, "url"),
    ("unknown field", {"url": "https://example.com/", "colour": "red"}, "colour"),
    ("meta that is not JSON", {**BASE, "meta": "{not json"}, "meta"),
    ("args that are not a list", {**BASE, "args": {"a": 1}}, "args"),
    ("two timings", {**BASE, "interval_s": 60, "cron": "* * * * *"}, "cron"),
    ("id with a space", {"id": "has space", "task": "t"}, "id"),
    ("no id and no url", {"task": "t", "interval_s": 5}, "id"),
    ("no task and no url", {"id": "x"}, "task"),
    ("unparsable run_at", {**BASE, "run_at": "yesterday"}, "run_at"),
    ("negative jitter", {**BASE, "jitter_s": -1}, "jitter_s"),
    ("priority out of range", {**BASE, "priority": 999}, "priority"),
    ("max_runs of zero", {**BASE, "max_runs": 0}, "max_runs"),
    ("enabled that is not a boolean", {**BASE, "enabled": "maybe"}, "enabled"),
    ("end before start", {**BASE, "start_at": "2030-01-02T00:00:00Z",
                          "end_at": "2030-01-01T00:00:00Z"}, "end_at"),
]


@pytest.mark.parametrize(("data", "field"), [(d, f) for _, d, f in BAD_ROWS],
                         ids=[name for name, _, _ in BAD_ROWS])
def test_bad_row_is_rejected_naming_field_and_row(data: dict[str, Any], field: str) -> None:
    """Each invalid value raises ValidationError with .field and .row, both in the message."""
    with pytest.raises(ValidationError) as caught:
        Job.from_dict(data, row=42)
    err = caught.value
    assert err.field == field
    assert err.row == 42
    text = str(err)
    assert text.startswith("line 42: ")
    assert field in text
    assert err.message in text
    assert isinstance(err, ValueError)


def test_error_without_a_row_does_not_invent_one() -> None:
    """Outside a file the error names the field only."""
    with pytest.raises(ValidationError) as caught:
        Job.from_dict({**BASE, "cron": "not a cron"})
    assert caught.value.row is None
    assert str(caught.value).startswith("cron: ")
    assert "row" not in str(caught.value)
    assert "'not a cron'" in str(caught.value)


@pytest.mark.parametrize(("cron", "message"), [
    ("61 * * * *", "'61' is not in 0-59 for minutes"),
    ("0 24 * * *", "'24' is not in 0-23 for hours"),
    ("0 0 0 * *", "'0' is not in 1-31 for days of month"),
    ("0 0 32 * *", "'32' is not in 1-31 for days of month"),
    ("0 0 1 13 *", "'13' is not in 1-12 for months"),
    ("0 0 * * 8", "'8' is not in 0-7 for days of week"),
    ("0 0 * * 1-9", "'9' is not in 0-7 for days of week"),
    ("0 0 1 foo *", "'foo' is not in 1-12 or jan-dec for months"),
    ("0 0 * * funday", "'funday' is not in 0-7 or sun-sat for days of week"),
    ("x * * * *", "'x' is not in 0-59 for minutes"),
    ("0 0 L 13 *", "'13' is not in 1-12 for months"),
    ("*/0 * * * *", "step '0' is not a whole number of 1 or more for minutes"),
    ("1, * * * *", "empty list item (a stray ',') for minutes"),
    ("* * * * * *",
     "expected 5 fields (minute hour day-of-month month day-of-week), got 6"),
    ("* * *", "expected 5 fields (minute hour day-of-month month day-of-week), got 3"),
    ("@daily", "expected 5 fields (minute hour day-of-month month day-of-week), got 1"),
    ("0 0 LW * *", "not a valid 5-field cron expression"),  # no one part to blame
    ("0 0 31 2 *", "never fires: no date matches it"),
])
def test_a_bad_cron_error_names_the_bad_part(cron: str, message: str) -> None:
    """As django-celery-beat does: the field and its range, or the count of fields."""
    with pytest.raises(ValidationError) as caught:
        Job.from_dict({**BASE, "cron": cron})
    assert caught.value.field == "cron"
    assert caught.value.message == message
    assert str(caught.value) == f"cron: {message} (got {cron!r})"


@pytest.mark.parametrize("cron", ["0 0 * * 7", "0 0 L * *", "0 0 15W * *", "0 0 * * 5#2",
                                  "0 0 * * L5", "0 0 ? jan-dec sun-sat", "*/15 1-5/2 * * *"])
def test_crons_croniter_accepts_stay_valid(cron: str) -> None:
    """Naming the bad part never rejects what croniter accepts."""
    assert Job.from_dict({**BASE, "cron": cron}).cron == cron


def test_an_error_about_none_does_not_say_got_none() -> None:
    """A null value adds nothing to the message: no "(got None)"."""
    err = ValidationError("url", None, "must be a string")
    assert str(err) == "url: must be a string"
    assert str(err.at_row(3)) == "line 3: url: must be a string"


@pytest.mark.parametrize(("name", "raw", "words"), [
    ("batch_size", "lots", "must be an integer"),
    ("domain_registrable", "maybe", "must be true or false"),
    ("lease_s", "long", "must be a number"),
])
def test_a_setting_of_the_wrong_type_is_named_with_its_article(
        name: str, raw: str, words: str) -> None:
    """"must be an integer", never "must be a int"."""
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_mapping({f"zsched_{name}": raw}, env={})
    assert f"zsched_{name} {words}, got {raw!r}" in str(caught.value)


def test_a_row_that_is_not_an_object_is_rejected() -> None:
    """A JSON document row that is a list or string is named as the row."""
    with pytest.raises(ValidationError) as caught:
        Job.from_dict(["not", "an", "object"], row=3)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.row) == ("row", 3)


def test_at_row_keeps_field_value_and_message() -> None:
    """at_row re-attributes an error to a row without losing anything."""
    err = ValidationError("interval_s", -1, "must be positive")
    moved = err.at_row(9)
    assert (moved.field, moved.value, moved.message, moved.row) == (
        "interval_s", -1, "must be positive", 9)
    assert str(moved) == "line 9: interval_s: must be positive (got -1)"


def test_valid_rows_still_parse() -> None:
    """The checks reject bad input only: good rows of every kind parse."""
    assert Job.from_dict({"url": "https://example.com/a"}).kind == "interval"
    assert Job.from_dict({**BASE, "cron": "*/15 * * * *", "timezone": "Europe/Berlin"}).kind == (
        "cron")
    assert Job.from_dict({**BASE, "run_at": "2030-01-01T09:00:00"}).kind == "once"
    assert Job.from_dict({**BASE, "meta": '{"a": 1}', "enabled": "no"}).meta == {"a": 1}


def _app(settings: Settings, redis_url: str, beat_schedule: dict[str, Any]) -> Celery:
    app = Celery("validation-tests", set_as_current=False)
    app.conf["broker_url"] = redis_url
    app.conf.zsched_redis_url = settings.redis_url
    app.conf.zsched_key_prefix = settings.key_prefix
    app.conf.beat_schedule = beat_schedule
    return app


@pytest.fixture(autouse=True)
def _no_env_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ZSCHED_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"task": "tests.noop", "schedule": -5}, "interval_s"),
        ({"schedule": 60.0}, "task"),
        ({"task": "tests.noop", "schedule": "hourly"}, "str is not supported"),
    ],
    ids=["negative interval", "missing task", "unsupported schedule"],
)
def test_bad_static_entry_fails_beat_start_and_writes_nothing(
    make_settings: Callable[..., Settings], redis_url: str, rclient: redis.Redis,
    entry: dict[str, Any], expected: str,
) -> None:
    """A bad beat_schedule entry raises ConfigurationError naming it; Redis stays untouched."""
    settings = make_settings()
    app = _app(settings, redis_url, {
        "good": {"task": "tests.noop", "schedule": 30.0},
        "broken entry": entry,
    })
    assert rclient.dbsize() == 0
    with pytest.raises(ConfigurationError) as caught:
        ZSchedScheduler(app=app)
    assert "'broken entry'" in str(caught.value)
    assert expected in str(caught.value)
    assert rclient.dbsize() == 0, "the good entry must not be half-imported"
