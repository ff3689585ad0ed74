"""Property-based: any row, any import file, either validates or raises the validation error.

Never anything else: no RecursionError, OverflowError, OSError, UnicodeError,
TypeError or bare ValueError, and an error message that always renders, short.
A row that validates must also be storable everywhere a job goes: strict JSON
(no NaN, no lone surrogate), a round trip through Redis' JSON and through an
export, and due times that stay representable. Deterministic regressions of
each crash are in ``test_bad_input.py``; the Django side is
``django/test_dj_bad_input_fuzz.py``.
"""

from __future__ import annotations

import csv
import io
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import event, given
from hypothesis import strategies as st

from celery_zsched.config import Settings
from celery_zsched.core.errors import ImportValidationError, ValidationError, show_value
from celery_zsched.core.formats import COLUMNS, read_rows
from celery_zsched.core.job import Defaults, Job
from celery_zsched.core.rows import parse_rows
from celery_zsched.core.timing import ms_to_dt
from tests.strategies import FIELDS, FUZZ, FUZZ_FILES, JSON_LIKE, ROWS

NOW_MS = 1_900_000_000_000  # 2030
SETTINGS = Settings(redis_url="redis://unused")


def _no_constant(name: str) -> Any:
    raise AssertionError(f"{name} in stored JSON")


def _assert_error_is_sound(exc: ValidationError, row: int | None) -> None:
    assert isinstance(exc.field, str) and exc.field
    assert isinstance(exc.message, str) and exc.message
    assert exc.row == row
    text = str(exc)  # renders whatever the value: huge, deep or undecodable
    assert len(text) < 2000, text[:200]
    text.encode("utf-8", "backslashreplace")


def _assert_storable(job: Job) -> None:
    """What every accepted job must survive: Redis JSON, an export, the scheduler."""
    text = job.to_json()
    text.encode("utf-8")  # no lone surrogate reaches Redis
    json.loads(text, parse_constant=_no_constant)  # strict JSON: no NaN, no Infinity
    assert Job.from_json(text) == job
    exported = job.to_dict()
    json.loads(json.dumps(exported), parse_constant=_no_constant)
    assert Job.from_dict(exported, Defaults(timezone=job.timezone)) == job
    rng = random.Random(7)
    for due in (job.first_due_ms(NOW_MS, SETTINGS, rng, phase=0.999),
                job.next_regular_ms(NOW_MS, SETTINGS, rng),
                job.retry_due_ms(1, NOW_MS, SETTINGS)):
        if due is not None:
            ms_to_dt(due)  # before year 10000: show, export and the admin can print it


@FUZZ
@given(ROWS)
def test_any_row_validates_or_raises_the_validation_error(data: dict[Any, Any]) -> None:
    """Job.from_dict, the Python API: the parser of every entry point."""
    try:
        job = Job.from_dict(data, Defaults(timezone="Europe/Berlin"), row=5)
    except ValidationError as exc:
        _assert_error_is_sound(exc, 5)
        event(f"rejected: {exc.field if exc.field in FIELDS else 'unknown field'}")
        return
    event(f"validated: {job.kind}")
    _assert_storable(job)


# ------------------------------------------------------------ import files
# Text spliced into a file between rows: malformed, deep, huge, or not UTF-8.
MANGLES = st.sampled_from([
    "[" * 5000 + "]" * 5000, "{" * 3000, '{"meta": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"interval_s": ' + "9" * 5000 + "}", '{"interval_s": NaN}', '{"meta": -Infinity}',
    '"row"', "[1, 2]", "null", "42", "{", "}", "]", ",", ",,", '{"a": }', "\x00",
    '{"name": "\\ud800"}', '{"url": "http://[::1"}', '{"timezone": "Europe", "cron": "* * * * *"}',
    '"unterminated', "\ufeff", "\u2028", '{"id": "a", "task": "t"} trailing',
])
RAW_BYTES = st.sampled_from([b"\xff\xfe", b"\xed\xa0\x80", b"\xc3", b"\x00", b"\xef\xbb\xbf"])


def _dump(value: Any) -> str:
    """JSON text of ``value`` as a careless exporter would write it: NaN, \\ud800,
    5000-digit numbers (the importer must refuse those itself)."""
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return json.dumps(value, default=show_value)
    except RecursionError:  # 3000-deep lists: MANGLES writes those as text
        return json.dumps(show_value(value))
    finally:
        sys.set_int_max_str_digits(limit)


def _cell(value: Any) -> str:
    if isinstance(value, str):
        return value
    return _dump(value)


def _write(rows: list[dict[Any, Any]], mangles: list[tuple[int, str]], fmt: str) -> str:
    lines = [_dump({k if isinstance(k, str) else show_value(k): v for k, v in row.items()})
             for row in rows]
    for at, text in mangles:
        lines.insert(min(at, len(lines)), text)
    if fmt == "json":
        return "[\n" + ",\n".join(lines) + "\n]\n"
    if fmt == "jsonl":
        return "\n".join(lines) + "\n"
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    columns = [c for c in COLUMNS if any(c in row for row in rows)] or ["id", "task"]
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row[c]) if c in row else "" for c in columns])
    text = out.getvalue()
    for at, mangle in mangles:
        parts = text.split("\n")
        parts.insert(min(at + 1, len(parts)), mangle)
        text = "\n".join(parts)
    return text


def _import(text: str, raw: bytes | None, fmt: str, skip_invalid: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"jobs.{fmt}"
        data = text.encode("utf-8", "surrogatepass")
        if raw is not None:
            data = data[: len(data) // 2] + raw + data[len(data) // 2:]
        path.write_bytes(data)
        try:
            result = parse_rows(read_rows(path), Defaults(), skip_invalid=skip_invalid)
        except ImportValidationError as exc:
            event("rejected: invalid rows")
            assert exc.errors and not skip_invalid
            for error in exc.errors:
                assert error.row is not None and error.row >= 1
                _assert_error_is_sound(error, error.row)
            assert len(str(exc)) < 200_000
            return
        except ValidationError as exc:  # the whole file: unreadable, malformed, shape
            event("rejected: the whole file")
            assert exc.row is None or exc.row >= 1
            _assert_error_is_sound(exc, exc.row)
            assert not str(exc).startswith("row ")  # a file problem names its line
            return
    event("imported" + (" (some rows skipped)" if result.errors else ""))
    for job in result.jobs:
        _assert_storable(job)
    for error in result.errors:
        _assert_error_is_sound(error, error.row)


FILES = st.tuples(
    st.lists(ROWS, max_size=6),
    st.lists(st.tuples(st.integers(0, 6), MANGLES), max_size=1),
    st.one_of(st.none(), st.none(), st.none(), RAW_BYTES),
    st.booleans(),
)


@FUZZ_FILES
@given(FILES, st.sampled_from(["json", "jsonl", "csv"]))
def test_any_import_file_is_read_or_rejected_with_the_validation_error(
        file: tuple[list[dict[Any, Any]], list[tuple[int, str]], bytes | None, bool],
        fmt: str) -> None:
    """read_rows + parse_rows, as ``celery zsched import`` and ``zsched_import`` use them."""
    rows, mangles, raw, skip_invalid = file
    _import(_write(rows, mangles, fmt), raw, fmt, skip_invalid)


@FUZZ
@given(st.lists(JSON_LIKE, min_size=1, max_size=4), st.sampled_from(["json", "jsonl"]))
def test_a_file_of_arbitrary_json_values_never_crashes(values: list[Any], fmt: str) -> None:
    """Rows that are any JSON value at all: not objects, objects of anything."""
    lines = [_dump(v) for v in values]
    text = ("[\n" + ",\n".join(lines) + "\n]") if fmt == "json" else "\n".join(lines)
    _import(text, None, fmt, skip_invalid=True)
