"""Bad input never crashes (invariant 8): one regression test per crash found by fuzzing.

Each bad value, whatever its type, size or shape, is rejected with
:class:`celery_zsched.ValidationError` naming the field (and the row, for
files); never a ``RecursionError``, ``OverflowError``, ``IsADirectoryError``,
``UnicodeEncodeError`` or a bare ``ValueError``. The property-based twin of
this module is ``test_bad_input_fuzz.py``.
"""

from __future__ import annotations

import json
import random
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Any

import pytest

from celery_zsched.config import Settings
from celery_zsched.core.errors import ConfigurationError, ImportValidationError, ValidationError
from celery_zsched.core.formats import read_rows
from celery_zsched.core.job import Defaults, Job
from celery_zsched.core.rows import parse_rows
from celery_zsched.core.timing import ms_to_dt
from celery_zsched.services.beat_entries import job_from_entry

BASE: dict[str, Any] = {"id": "job-1", "task": "tests.noop"}
DEEP = 100_000  # far past the interpreter's recursion limit
HUGE = 10**400  # a valid JSON number that no float can hold


def _id(value: Any) -> str:
    """A short test id: some parameters are megabytes long."""
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 24 else f"{text[:16]}...({len(text)})"


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def _rejected(data: Any, field: str, row: int | None = 7) -> ValidationError:
    """``data`` raises ValidationError naming ``field`` (and ``row``); its text renders."""
    with pytest.raises(ValidationError) as caught:
        Job.from_dict(data, row=row)
    err = caught.value
    assert err.field == field, str(err)
    assert err.row == row
    text = str(err)
    assert text.startswith(f"line {row}: {field}: " if row is not None else f"{field}: ")
    assert len(text) < 1000, "a huge value must be shortened in the message"
    return err


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------- the fuzzer's crashes
def test_a_url_with_a_broken_ipv6_host_is_a_url_error() -> None:
    """``http://[::1`` made urlsplit raise ``ValueError: Invalid IPv6 URL``."""
    for url in ("http://[::1", "https://[fe80::1/x", "http://a]/", "http://[::1]:99999/"):
        _rejected({"url": url}, "url")


@pytest.mark.parametrize("field", ["interval_s", "jitter_s", "expires_s", "misfire_grace_s",
                                   "retry_base_s", "run_at", "start_at", "end_at",
                                   "max_runs", "priority", "retry_max"])
def test_a_huge_integer_is_a_field_error_not_an_overflow(field: str) -> None:
    """An integer past any float made ``float()`` raise ``OverflowError``."""
    _rejected({**BASE, field: HUGE}, field)
    _rejected({**BASE, field: -HUGE}, field)


@pytest.mark.parametrize("zone", ids=_id, argvalues=[
    "Europe", "America", "Etc", "Europe/", "right", "posix", "Europe/" + "x" * 300, "x" * 5000,
    "Europe/\udcff"])
def test_a_time_zone_naming_a_folder_or_nothing_is_a_timezone_error(zone: str) -> None:
    """``Europe`` (a folder of the zone database) made ZoneInfo raise ``IsADirectoryError``."""
    _rejected({**BASE, "cron": "0 9 * * *", "timezone": zone}, "timezone")


@pytest.mark.parametrize("field", ["meta", "args", "kwargs"])
def test_deeply_nested_containers_are_rejected(field: str) -> None:
    """Nesting past the limit is rejected, as a value and as a JSON cell (CSV)."""
    deep: Any = {"a": _nested(DEEP)} if field != "args" else _nested(DEEP)
    _rejected({**BASE, field: deep}, field)
    cell = '{"a": ' + "[" * DEEP + "]" * DEEP + "}" if field != "args" else "[" * DEEP + "]" * DEEP
    _rejected({**BASE, field: cell}, field)
    shallow: Any = {"a": _nested(60)} if field != "args" else _nested(60)
    _rejected({**BASE, field: shallow}, field)


@pytest.mark.parametrize(("field", "value"), ids=_id, argvalues=[
    ("name", "caf\udce9"), ("task", "tasks.\ud800"), ("url", "https://example.com/\udcff"),
    ("queue", "q\ud800"), ("routing_key", "\udfff"), ("cron", "0 9 * * *\ud800"),
    ("meta", {"k": "v\ud800"}), ("meta", {"\udc80": 1}), ("args", ["\ud83d"]),
    ("kwargs", {"k": ["x", {"y": "\udfff"}]}),
    ("name", "nul\x00byte"), ("task", "t\x00"), ("meta", {"k": "\x00"}), ("url", "https://a/\x00"),
])
def test_invalid_unicode_is_rejected_in_every_text(field: str, value: Any) -> None:
    """Lone surrogates cannot be encoded (Redis, SQL) and NUL cannot be stored (PostgreSQL)."""
    _rejected({**BASE, field: value}, field)


@pytest.mark.parametrize(("field", "value"), ids=_id, argvalues=[
    ("interval_s", float("nan")), ("interval_s", "-inf"), ("jitter_s", float("inf")),
    ("expires_s", "NaN"), ("run_at", float("nan")), ("start_at", float("inf")),
    ("max_runs", float("inf")), ("priority", float("nan")),
    ("meta", {"x": float("nan")}), ("args", [float("inf")]), ("kwargs", {"x": -float("inf")}),
])
def test_nan_and_infinity_are_rejected_everywhere(field: str, value: Any) -> None:
    """Not even inside meta/args/kwargs: NaN is not JSON, and PostgreSQL's jsonb refuses it."""
    _rejected({**BASE, field: value}, field)


@pytest.mark.parametrize(("field", "value"), ids=_id, argvalues=[
    ("interval_s", 1e308), ("jitter_s", 1e308), ("expires_s", 1e300),
    ("misfire_grace_s", 1e300), ("retry_base_s", 1e300), ("max_runs", 2**31),
    ("run_at", -1e20), ("run_at", "0001-01-01T00:00:00"), ("start_at", "1969-12-31T23:59:59Z"),
    ("end_at", 253_402_300_800), ("run_at", "9999-12-31T23:00:00-05:00"),
    ("max_runs", 1e308), ("retry_max", 10**6), ("priority", -1),
])
def test_out_of_range_times_and_numbers_are_rejected(field: str, value: Any) -> None:
    """A due time must stay between 1970 and year 10000 (export, SQL, Redis scores)."""
    _rejected({**BASE, field: value}, field)


@pytest.mark.parametrize(("field", "value"), ids=_id, argvalues=[
    ("name", "n" * 201), ("task", "t" * 201), ("queue", "q" * 201), ("routing_key", "r" * 201),
    ("url", "https://example.com/" + "p" * 2000), ("cron", "0 9 * * " + "1," * 100 + "1"),
    ("timezone", "Europe/" + "B" * 100), ("meta", {"blob": "x" * 2_000_000}),
    ("args", list(range(400_000))), ("id", "i" * 201),
])
def test_absurdly_long_values_are_rejected(field: str, value: Any) -> None:
    """Text fields have the Django model's max_length; containers at most 1 MiB of JSON."""
    _rejected({**BASE, field: value}, field)


@pytest.mark.parametrize(("field", "value"), ids=_id, argvalues=[
    ("meta", {1: "int key"}), ("kwargs", {None: 1}), ("args", [{1.5: "x"}]),
    ("meta", {"when": object()}), ("args", [{1, 2}]), ("enabled", HUGE), ("enabled", [True]),
    ("name", 5), ("cron", ["0", "9"]), ("timezone", b"UTC"), ("url", b"https://a/"),
    ("run_at", object()), ("interval_s", [1]), ("interval_s", {"$ref": "x"}),
])
def test_wrong_types_are_rejected(field: str, value: Any) -> None:
    _rejected({**BASE, field: value}, field)


def test_a_field_name_that_cannot_be_printed_is_still_reported() -> None:
    """An unknown key of any type, even one ``str()`` refuses (a 5000-digit int)."""
    with pytest.raises(ValidationError) as caught:
        Job.from_dict({**BASE, 10**5000: 1}, row=7)
    assert caught.value.message == "unknown field"
    assert str(caught.value).startswith("line 7: ")
    assert len(str(caught.value)) < 300


def test_the_message_of_a_huge_or_deep_value_is_short_and_never_raises() -> None:
    """repr() of these raises (int digit limit, recursion) or is megabytes long."""
    for value in (10**5000, _nested(DEEP), "x" * 10_000_000, {"k": _nested(DEEP)}):
        text = str(ValidationError("meta", value, "bad", row=3))
        assert text.startswith("line 3: meta: bad (got ") and len(text) < 300


def test_valid_values_at_the_limits_still_parse() -> None:
    """The new limits reject only what could not be stored or shown."""
    job = Job.from_dict({
        **BASE, "name": "n" * 200, "queue": "q" * 200, "interval_s": 3_155_760_000,
        "jitter_s": 0, "meta": {"a": _nested(30), "s": "é ✓ 😀"}, "max_runs": 2**31 - 1,
        "start_at": 0, "end_at": "9999-12-31T23:59:59Z", "timezone": "America/Argentina/Salta",
        "url": "https://[::1]:8080/ok",
    })
    assert Job.from_json(job.to_json()) == job
    assert Job.from_dict({**BASE, "run_at": "1970-01-01T00:00:00Z"}).run_at == 0


@pytest.mark.parametrize("cron", ["* * * * *", "0 0 1 1 *"])
def test_a_start_at_that_leaves_no_run_before_year_10000_ends_the_job(cron: str) -> None:
    """A start_at late in 9999 validates (it is a time), but the run after it would fall
    in year 10000, which no datetime, export or page can hold: the job has no run, as
    past an end_at. croniter raised OverflowError here (found by the fuzz test); an
    interval job's staggered first run went past year 10000 unchecked."""
    settings = Settings(redis_url="redis://unused")
    now, rng = 1_900_000_000_000, random.Random(3)
    job = Job.from_dict({**BASE, "cron": cron, "start_at": "9999-12-31T23:59:59Z"})
    assert job.first_due_ms(now, settings, rng) is None
    assert job.next_regular_ms(now, settings, rng) is None
    late = Job.from_dict({**BASE, "cron": "0 0 * * *", "start_at": "9999-12-30T12:00:00Z"})
    due = late.first_due_ms(now, settings, rng)
    assert due is not None and ms_to_dt(due).isoformat() == "9999-12-31T00:00:00+00:00"
    assert late.next_regular_ms(due, settings, rng) is None
    interval = Job.from_dict({**BASE, "interval_s": 3600, "jitter_s": 0,
                              "start_at": "9999-12-31T23:30:00Z"})
    start = interval.start_at
    assert interval.first_due_ms(now, settings, rng) == start
    assert interval.first_due_ms(now, settings, rng, phase=0.999) is None  # 23:30 + 0.999 h
    assert interval.next_regular_ms(now, settings, rng) == start


# --------------------------------------------------------------- import files
@pytest.mark.parametrize(("name", "text", "line"), ids=_id, argvalues=[
    ("jobs.json", "[\n" + "[" * DEEP + "]" * DEEP + "\n]", 2),
    ("jobs.json", "[\n  {\"url\": \"https://a.example/1\"},\n  {\"meta\": "
     + "[" * DEEP + "]" * DEEP + "}\n]", 3),
    ("jobs.json", "[" * DEEP + "]" * DEEP, 1),
    ("jobs.json", '{"meta": ' + "{\"a\":" * DEEP + "1" + "}" * DEEP + "}", 1),
    ("jobs.jsonl", '{"url": "https://a.example/1"}\n{"meta": ' + "[" * DEEP + "]" * DEEP
     + "}\n", 2),
])
def test_a_deeply_nested_json_file_is_a_file_error(tmp_path: Path, name: str, text: str,
                                                   line: int) -> None:
    """json raised ``RecursionError`` from the middle of the file."""
    with pytest.raises(ValidationError) as caught:
        read_rows(_file(tmp_path, name, text))
    assert (caught.value.field, caught.value.row) == ("file", line)
    assert "nested too deeply" in caught.value.message
    assert f"line {line}" in str(caught.value)


@pytest.mark.parametrize(("name", "text"), ids=_id, argvalues=[
    ("jobs.json", '[\n  {"url": "https://a.example/1"},\n  {"interval_s": ' + "9" * 5000
     + "}\n]"),
    ("jobs.jsonl", '{"url": "https://a.example/1"}\n{"interval_s": ' + "9" * 5000 + "}\n"),
])
def test_a_number_past_the_int_digit_limit_is_a_file_error(tmp_path: Path, name: str,
                                                           text: str) -> None:
    """json raised a bare ``ValueError`` (Exceeds the limit (4300 digits))."""
    with pytest.raises(ValidationError) as caught:
        read_rows(_file(tmp_path, name, text))
    assert (caught.value.field, caught.value.row) == ("file", 3 if name == "jobs.json" else 2)


def test_every_crash_of_the_fuzzer_is_a_row_error_in_an_import(tmp_path: Path) -> None:
    """One JSON file holding each crash: every row reported by line and field."""
    rows = [
        '{"url": "http://[::1"}',
        '{"id": "a", "task": "t", "interval_s": ' + str(HUGE) + "}",
        '{"id": "b", "task": "t", "cron": "0 9 * * *", "timezone": "Europe"}',
        '{"id": "c", "task": "t", "name": "\\ud800"}',
        '{"id": "d", "task": "t", "interval_s": NaN}',
        '{"id": "e", "task": "t", "meta": {"x": Infinity}}',
        '{"id": "f", "task": "t", "run_at": -1e20}',
        '{"id": "g", "task": "t", "name": "' + "n" * 100_000 + '"}',
        '{"id": "h", "task": "t", "meta": ' + "[" * 200 + "]" * 200 + "}",
        '{"url": "https://a.example/ok"}',
    ]
    path = _file(tmp_path, "jobs.json", "[\n" + ",\n".join(rows) + "\n]\n")
    with pytest.raises(ImportValidationError) as caught:
        parse_rows(read_rows(path), Defaults())
    found = [(e.row, e.field) for e in caught.value.errors]
    assert found == [(2, "url"), (3, "interval_s"), (4, "timezone"), (5, "name"),
                     (6, "interval_s"), (7, "meta"), (8, "run_at"), (9, "name"), (10, "meta")]
    assert len(str(caught.value)) < 5000


def test_a_csv_cell_of_deep_json_is_a_row_error(tmp_path: Path) -> None:
    path = _file(tmp_path, "jobs.csv", 'id,task,meta\na,t,"' + "[" * 50_000 + '"\nb,t,{}\n')
    with pytest.raises(ImportValidationError) as caught:
        parse_rows(read_rows(path), Defaults())
    assert [(e.row, e.field) for e in caught.value.errors] == [(2, "meta")]


# ----------------------------------------------------- whole-file wording
@pytest.mark.parametrize(("name", "text", "line", "words"), ids=_id, argvalues=[
    ("jobs.jsonl", '"row"\n', 1, "line 1 is a JSON string, not an object"),
    ("jobs.json", '[\n  {"url": "https://a.example/1"},\n  [1, 2]\n]', 3,
     "line 3 is a JSON array, not an object"),
    ("jobs.json", '\n"row"', 2, "must be a JSON array of objects, not a JSON string"),
    ("jobs.json", '[\n  {"url": "https://a.example/1"}\n  {"url": "x"}\n]', 3,
     "malformed JSON at line 3, column 3: Expecting ',' delimiter"),
    ("jobs.csv", "url\nhttps://a.example/1,,\nhttps://a.example/2,x\n", 3,
     "line 3 has 2 cells but the header has 1 column"),
])
def test_a_whole_file_problem_is_not_reported_as_a_row(tmp_path: Path, name: str, text: str,
                                                       line: int, words: str) -> None:
    """It read ``row 1: file: each row must be a JSON object (got 'row')``."""
    with pytest.raises(ValidationError) as caught:
        read_rows(_file(tmp_path, name, text))
    text_of = str(caught.value)
    assert (caught.value.field, caught.value.row) == ("file", line)
    assert text_of.startswith("file: "), text_of
    assert not text_of.startswith("row"), text_of
    assert words in text_of


def test_a_bad_csv_header_names_the_column_and_its_line(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as caught:
        read_rows(_file(tmp_path, "jobs.csv", "url,colour\nhttps://a.example/1,red\n"))
    assert (caught.value.field, caught.value.row) == ("colour", 1)
    assert str(caught.value).startswith("colour: unknown column in the header (line 1)")


# ----------------------------------------------------------- beat_schedule
@pytest.mark.parametrize(("entry", "field"), [
    ({"task": "t", "schedule": HUGE}, "interval_s"),
    ({"task": "t", "schedule": float("nan")}, "interval_s"),
    ({"task": "t", "schedule": 60, "args": 5}, "args"),
    ({"task": "t", "schedule": 60, "args": "abc"}, "args"),
    ({"task": "t", "schedule": 60, "kwargs": "abc"}, "kwargs"),
    ({"task": "t", "schedule": 60, "kwargs": [1, 2]}, "kwargs"),
    ({"task": "t", "schedule": 60, "options": {"priority": HUGE}}, "priority"),
    ({"task": "t", "schedule": 60, "options": {"queue": "\ud800"}}, "queue"),
    ({"task": 5, "schedule": 60}, "task"),
])
def test_a_bad_beat_schedule_entry_is_a_configuration_error(entry: dict[str, Any],
                                                            field: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        job_from_entry("nightly", entry, Defaults())
    assert str(caught.value).startswith(f"beat_schedule['nightly'].{field}: ")
    assert isinstance(caught.value.__cause__, ValidationError)


@pytest.mark.parametrize("entry", [5, None, "every minute", {"task": "t", "schedule": 60,
                                                               "options": "fast"}])
def test_a_beat_schedule_entry_of_the_wrong_shape_is_a_configuration_error(entry: Any) -> None:
    with pytest.raises(ConfigurationError) as caught:
        job_from_entry("nightly", entry, Defaults())
    assert "beat_schedule['nightly']" in str(caught.value)


def test_tuple_args_of_a_beat_schedule_entry_still_work() -> None:
    job = job_from_entry("add", {"task": "t", "schedule": 5, "args": (16, 16)}, Defaults())
    assert job.args == [16, 16]
    assert json.loads(job.to_json())["args"] == [16, 16]


def test_a_stored_definition_loads_to_the_job_it_was_with_containers_of_its_own() -> None:
    """``Job.from_json`` fills a job in past the dataclass's ``__init__`` (a worker parses
    one per settle): every field as ``from_dict`` gives it, and no default list or dict
    shared between two jobs; a definition without its id or task still raises."""
    sparse = Job.from_dict({**BASE, "interval_s": 60})
    full = Job.from_dict({**BASE, "cron": "*/5 * * * *", "timezone": "Europe/Berlin",
                          "meta": {"k": [1, 2]}, "args": [1], "kwargs": {"a": 1},
                          "max_runs": 3, "queue": "q", "retry_max": 2})
    for job in (sparse, full):
        loaded = Job.from_json(job.to_json())
        assert loaded == job
        assert {name: getattr(loaded, name) for name in job.__dataclass_fields__} == \
            {name: getattr(job, name) for name in job.__dataclass_fields__}
    one, two = Job.from_json(sparse.to_json()), Job.from_json(sparse.to_json())
    assert one.meta == {} and one.meta is not two.meta and one.args is not two.args
    with pytest.raises(FrozenInstanceError):
        one.task = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Job.from_json('{"interval_s": 60}')
