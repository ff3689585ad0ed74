"""The importer: every format, errors that name the field and the line, exports that re-import.

Store-touching tests run against the throwaway Redis of conftest.py.
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from celery_zsched.core.errors import ImportValidationError, ValidationError
from celery_zsched.core.formats import COLUMNS, DEFAULT_MAX_BYTES, Row, iter_rows, read_rows
from celery_zsched.core.job import Defaults, Job, job_id_for_url
from celery_zsched.core.rows import parse_rows, write_rows
from celery_zsched.services.importer import import_file
from celery_zsched.store import Store

BERLIN = Defaults(timezone="Europe/Berlin")


def _file(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _store_keys(store: Store) -> int:
    return int(store.client.exists(*store.keys.all()))


def due_times(store: Store) -> dict[str, float]:
    """Job id -> due time (ms) of every scheduled job."""
    pairs = cast("list[tuple[str, float]]",
                 store.client.zrange(store.keys.schedule, 0, -1, withscores=True))
    return dict(pairs)


# ----------------------------------------------------------------- reading
def test_json_rows_carry_the_line_of_their_opening_brace(tmp_path: Path) -> None:
    path = _file(tmp_path, "jobs.json", (
        "[\n"                                                      # 1
        '  {"url": "https://a.example/1", "interval_s": 60},\n'    # 2
        "  {\n"                                                    # 3
        '    "id": "feed", "task": "feeds.fetch",\n'               # 4
        '    "cron": "*/15 * * * *", "meta": {"x": [1, 2]}\n'      # 5
        "  }, {\"url\": \"https://a.example/3\"}\n"                # 6
        "]\n"
    ))
    rows = read_rows(path)
    assert [r.line for r in rows] == [2, 3, 6]
    assert rows[1].data == {"id": "feed", "task": "feeds.fetch", "cron": "*/15 * * * *",
                            "meta": {"x": [1, 2]}}
    assert rows[2] == Row(6, {"url": "https://a.example/3"})


def test_an_empty_json_array_has_no_rows(tmp_path: Path) -> None:
    assert read_rows(_file(tmp_path, "jobs.json", " [ \n ] \n")) == []


def test_jsonl_rows_skip_blank_lines_and_keep_line_numbers(tmp_path: Path) -> None:
    path = _file(tmp_path, "jobs.jsonl", (
        '{"url": "https://a.example/1"}\n'
        "\n"
        '  {"url": "https://a.example/2", "meta": {"note": "a\u2028b"}}\r\n'
        "   \n"
        '{"id": "x", "task": "t"}'
    ))
    rows = read_rows(path)
    assert [r.line for r in rows] == [1, 3, 5]
    assert rows[1].data["meta"] == {"note": "a\u2028b"}


def test_csv_rows_use_physical_lines_drop_empty_cells_and_parse_as_jobs(tmp_path: Path) -> None:
    path = _file(tmp_path, "jobs.csv", (
        "\ufeffurl,interval_s,name,meta,enabled,priority\n"        # 1 (with a BOM)
        'https://a.example/1,60,"two\nlines","{""k"": 1}",false,5\n'  # 2-3
        "\n"                                                        # 4
        "https://a.example/2,,,,,\n"                                # 5
        "https://a.example/3,30\n"                                  # 6: short row
    ))
    rows = read_rows(path)
    assert [r.line for r in rows] == [2, 5, 6]
    assert rows[0].data == {"url": "https://a.example/1", "interval_s": "60",
                            "name": "two\nlines", "meta": '{"k": 1}', "enabled": "false",
                            "priority": "5"}
    assert rows[1].data == {"url": "https://a.example/2"}
    jobs = parse_rows(rows, BERLIN).jobs
    assert jobs[0].interval_s == 60.0 and jobs[0].meta == {"k": 1}
    assert jobs[0].enabled is False and jobs[0].priority == 5 and jobs[0].name == "two\nlines"
    assert jobs[1].interval_s == BERLIN.interval_s and jobs[1].enabled is True
    assert jobs[2].interval_s == 30.0


def test_the_format_comes_from_the_suffix_unless_given(tmp_path: Path) -> None:
    path = _file(tmp_path, "jobs.txt", '{"url": "https://a.example/1"}\n')
    with pytest.raises(ValidationError) as caught:
        read_rows(path)
    assert caught.value.field == "format"
    assert [r.line for r in read_rows(path, "jsonl")] == [1]
    with pytest.raises(ValidationError) as caught:
        read_rows(path, "xml")
    assert caught.value.field == "format"


def test_iter_rows_checks_the_file_before_the_first_row(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as caught:
        iter_rows(tmp_path / "missing.json")
    assert caught.value.field == "file"
    assert "cannot be read" in caught.value.message


# ----------------------------------------------------------- file errors
@pytest.mark.parametrize(("name", "text", "line", "column"), [
    ("jobs.json", '[\n  {"url": "https://a.example/1"}\n  {"url": "x"}\n]', 3, 3),
    ("jobs.json", '[\n  {"url": "https://a.example/1",}\n]', 2, 33),
    ("jobs.json", '[\n  {"url": "https://a.example/1"},\n]\n', 3, 1),
    ("jobs.json", '[\n  {"url": "https://a.example/1"}\n', 3, 1),
    ("jobs.json", '[{"url": "https://a.example/1"}]\n]', 2, 1),
    ("jobs.jsonl", '{"url": "https://a.example/1"}\n\n{"url": "x"\n', 3, 12),
])
def test_malformed_json_names_the_line_and_column(tmp_path: Path, name: str, text: str,
                                                  line: int, column: int) -> None:
    with pytest.raises(ValidationError) as caught:
        read_rows(_file(tmp_path, name, text))
    assert caught.value.field == "file"
    assert caught.value.row == line
    assert f"at line {line}, column {column}" in caught.value.message
    # A whole-file problem names its line, never a row (no job row is at fault).
    assert str(caught.value).startswith(f"file: malformed JSON at line {line}, column {column}")


def test_a_json_document_that_is_not_an_array_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as caught:
        read_rows(_file(tmp_path, "jobs.json", '\n{"url": "https://a.example/1"}'))
    assert (caught.value.field, caught.value.row) == ("file", 2)
    assert "array" in caught.value.message


@pytest.mark.parametrize(("name", "text", "line"), [
    ("jobs.json", '[\n  {"url": "https://a.example/1"},\n  "https://a.example/2"\n]', 3),
    ("jobs.jsonl", '{"url": "https://a.example/1"}\n[1, 2]\n', 2),
])
def test_a_row_that_is_not_an_object_is_rejected_with_its_line(
        tmp_path: Path, name: str, text: str, line: int) -> None:
    with pytest.raises(ValidationError) as caught:
        read_rows(_file(tmp_path, name, text))
    assert (caught.value.field, caught.value.row) == ("file", line)
    assert "JSON object" in caught.value.message


def test_an_unknown_csv_column_is_named(tmp_path: Path) -> None:
    path = _file(tmp_path, "jobs.csv", "url,colour\nhttps://a.example/1,red\n")
    with pytest.raises(ValidationError) as caught:
        read_rows(path)
    assert (caught.value.field, caught.value.row) == ("colour", 1)
    assert "unknown column" in caught.value.message


def test_a_duplicate_csv_column_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as caught:
        read_rows(_file(tmp_path, "jobs.csv", "url,url\nhttps://a.example/1,x\n"))
    assert (caught.value.field, caught.value.row) == ("url", 1)


def test_a_csv_row_with_more_cells_than_columns_is_rejected(tmp_path: Path) -> None:
    path = _file(tmp_path, "jobs.csv", "url\nhttps://a.example/1,,\nhttps://a.example/2,x\n")
    with pytest.raises(ValidationError) as caught:
        read_rows(path)
    assert (caught.value.field, caught.value.row) == ("file", 3)


def test_an_oversized_file_is_rejected_before_it_is_parsed(tmp_path: Path) -> None:
    path = _file(tmp_path, "jobs.json", "[" + " " * 200 + "]")
    assert read_rows(path, max_bytes=202) == []
    with pytest.raises(ValidationError) as caught:
        read_rows(path, max_bytes=201)
    assert caught.value.field == "file"
    assert "202 bytes, over the limit of 201" in caught.value.message
    assert DEFAULT_MAX_BYTES == 256 * 1024 * 1024


def test_a_missing_file_and_a_directory_cannot_be_read(tmp_path: Path) -> None:
    for path in (tmp_path / "missing.json", tmp_path):
        with pytest.raises(ValidationError) as caught:
            read_rows(path, "json")
        assert caught.value.field == "file"
        assert "cannot be read" in caught.value.message


def test_a_file_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = _file(tmp_path, "jobs.csv", b"url\nhttps://a.example/1\nhttps://a.example/\xff\n")
    with pytest.raises(ValidationError) as caught:
        read_rows(path)
    assert (caught.value.field, caught.value.row) == ("file", 3)


# ------------------------------------------------------------- row errors
def test_every_bad_json_row_is_reported_with_its_field_and_line(tmp_path: Path) -> None:
    path = _file(tmp_path, "jobs.json", (
        "[\n"
        '  {"url": "https://a.example/1", "interval_s": 60},\n'
        '  {"url": "https://a.example/2", "interval_s": -5},\n'
        '  {"id": "c", "task": "t", "cron": "0 0 31 2 *"},\n'
        '  {"id": "z", "task": "t", "cron": "* * * * *", "timezone": "Mars/Base"},\n'
        '  {"url": "ftp://a.example/5"}\n'
        "]\n"
    ))
    with pytest.raises(ImportValidationError) as caught:
        parse_rows(read_rows(path), BERLIN)
    found = [(e.row, e.field) for e in caught.value.errors]
    assert found == [(3, "interval_s"), (4, "cron"), (5, "timezone"), (6, "url")]
    # A JSON array names the job by position and id or URL, not by line.
    assert ("job 2 (url 'https://a.example/2'): interval_s: must be a finite number >= 0.001 "
            "(got -5)") in str(caught.value)
    assert [e.job for e in caught.value.errors] == [2, 3, 4, 5]
    assert "never fires" in caught.value.errors[1].message


@pytest.mark.parametrize("indent", [None, 2], ids=["one-line", "pretty"])
def test_a_json_array_names_the_job_by_position_and_id_not_line(
        tmp_path: Path, indent: int | None) -> None:
    """A one-line array made every job "row 1"; a pretty one made the 4th job "row 23"."""
    rows: list[dict[str, object]] = [{"url": f"https://a.example/{i}"} for i in range(3)]
    rows.append({"id": "nightly", "task": "t", "cron": "61 * * * *"})
    path = _file(tmp_path, "jobs.json", json.dumps(rows, indent=indent))
    with pytest.raises(ImportValidationError) as caught:
        parse_rows(read_rows(path), BERLIN)
    [error] = caught.value.errors
    assert str(error).startswith("job 4 (id 'nightly'): cron: "), str(error)
    assert "line" not in str(error).split(":")[0]


@pytest.mark.parametrize(("name", "text", "where"), [
    ("jobs.jsonl", '{"url": "https://a.example/1"}\n\n{"url": "ftp://x"}\n',
     "job 2 (line 3, url 'ftp://x'): url: "),
    ("jobs.csv", "id,task,cron\na,t,0 9 * * *\nb,t,61 * * * *\n",
     "job 2 (line 3, id 'b'): cron: "),
    ("jobs.csv", "task,cron\nt,0 9 * * *\n", "job 1 (line 2): id: "),
])
def test_jsonl_and_csv_errors_keep_the_line(tmp_path: Path, name: str, text: str,
                                            where: str) -> None:
    with pytest.raises(ImportValidationError) as caught:
        parse_rows(read_rows(_file(tmp_path, name, text)), BERLIN)
    assert str(caught.value.errors[0]).startswith(where), str(caught.value.errors[0])


def test_a_bad_csv_row_is_reported_with_its_physical_line(tmp_path: Path) -> None:
    path = _file(tmp_path, "jobs.csv", (
        "id,task,cron,name\n"
        'a,t,*/5 * * * *,"multi\nline"\n'
        "b,t,61 * * * *,\n"
    ))
    with pytest.raises(ImportValidationError) as caught:
        parse_rows(read_rows(path), BERLIN)
    [error] = caught.value.errors
    assert (error.row, error.field, error.value) == (4, "cron", "61 * * * *")


def test_duplicate_ids_are_reported_on_the_later_row(tmp_path: Path) -> None:
    url = "https://a.example/same"
    path = _file(tmp_path, "jobs.jsonl", "\n".join([
        json.dumps({"url": url, "interval_s": 60}),
        json.dumps({"id": "other", "task": "t"}),
        json.dumps({"url": url, "interval_s": 120}),
        json.dumps({"id": job_id_for_url(url), "task": "t"}),
    ]))
    with pytest.raises(ImportValidationError) as caught:
        parse_rows(read_rows(path), BERLIN)
    assert [(e.row, e.field, e.value) for e in caught.value.errors] == [
        (3, "id", job_id_for_url(url)), (4, "id", job_id_for_url(url))]
    assert "first as job 1 (line 1)" in caught.value.errors[0].message
    assert str(caught.value.errors[1]).startswith(
        f"job 4 (line 4, id '{job_id_for_url(url)}'): id: duplicate id")


def test_skip_invalid_keeps_the_valid_rows_in_order_and_reports_the_rest() -> None:
    rows = [
        Row(2, {"url": "https://a.example/1"}),
        Row(3, {"url": "https://a.example/2", "priority": 999}),
        Row(4, {"id": "t1", "task": "t", "interval_s": 5}),
        Row(5, {"id": "t1", "task": "t", "interval_s": 6}),
        Row(6, {"url": "https://a.example/1", "unknown": 1}),
    ]
    result = parse_rows(rows, BERLIN, skip_invalid=True)
    assert [j.id for j in result.jobs] == [job_id_for_url("https://a.example/1"), "t1"]
    assert result.jobs[1].interval_s == 5.0
    assert [(e.row, e.field) for e in result.errors] == [(3, "priority"), (5, "id"),
                                                        (6, "unknown")]
    with pytest.raises(ImportValidationError) as caught:
        parse_rows(rows, BERLIN)
    assert len(caught.value.errors) == 3
    assert str(caught.value).startswith("3 invalid job(s), nothing was written")


# ----------------------------------------------------------------- export
def _varied_jobs() -> list[Job]:
    rows: list[dict[str, Any]] = [
        {"url": "https://a.example/p?q=1,2", "interval_s": 300, "meta": {"site": "ä", "n": 1}},
        {"url": "https://a.example/utc", "interval_s": 0.5, "timezone": "UTC", "jitter_s": 0},
        {"id": "feed:berlin", "task": "feeds.fetch", "cron": "*/15  *  * * *",
         "kwargs": {"deep": {"x": [1, None, True]}}, "queue": "feeds", "routing_key": "f.b",
         "priority": 0, "expires_s": 90.25, "misfire_grace_s": 30},
        {"id": "once", "task": "reports.build", "run_at": "2031-03-30T02:30:00",
         "args": [1, "two", {"three": 3}], "name": 'a "quoted", multi\nline name'},
        {"id": "window", "task": "t", "interval_s": 3600, "timezone": "America/New_York",
         "start_at": "2030-01-01T00:00:00Z", "end_at": 2000000000.5, "max_runs": 3,
         "enabled": False, "retry_max": 0, "retry_base_s": 1.5},
    ]
    return [Job.from_dict(row, BERLIN, row=i) for i, row in enumerate(rows, 1)]


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv"])
def test_an_export_re_imports_to_identical_jobs(tmp_path: Path, fmt: str) -> None:
    jobs = _varied_jobs()
    path = tmp_path / f"export.{fmt}"
    with open(path, "w", encoding="utf-8", newline="") as fp:
        assert write_rows(jobs, fp, fmt) == len(jobs)
    # Other defaults on the way back in: the export must not lean on them.
    elsewhere = Defaults(task="other", interval_s=7, timezone="Asia/Tokyo")
    again = parse_rows(read_rows(path), elsewhere).jobs
    assert again == jobs
    assert [j.to_json() for j in again] == [j.to_json() for j in jobs]
    assert again[1].timezone == "UTC" and again[2].timezone == "Europe/Berlin"


def test_a_json_export_is_an_indented_array_with_one_object_per_line() -> None:
    jobs = _varied_jobs()[:2]
    out = io.StringIO()
    write_rows(jobs, out, "json")
    lines = out.getvalue().split("\n")
    assert lines[0] == "[" and lines[3] == "]" and lines[4] == ""
    assert lines[1].startswith('  {"id": "') and lines[1].endswith("},")
    assert json.loads(lines[2]) == {**jobs[1].to_dict()}
    assert list(json.loads(lines[2])) == [c for c in COLUMNS if c in jobs[1].to_dict()]


def test_a_csv_export_has_every_column_once() -> None:
    out = io.StringIO()
    write_rows(_varied_jobs()[:1], out, "csv")
    header, row = out.getvalue().splitlines()[:2]
    assert header.split(",") == list(COLUMNS)
    assert row.startswith(f"{job_id_for_url('https://a.example/p?q=1,2')},scrape,300.0,")


@pytest.mark.parametrize(("fmt", "text"), [("json", "[]\n"), ("jsonl", ""),
                                           ("csv", ",".join(COLUMNS) + "\n")])
def test_an_empty_export_re_imports_to_nothing(tmp_path: Path, fmt: str, text: str) -> None:
    path = tmp_path / f"empty.{fmt}"
    with open(path, "w", encoding="utf-8") as fp:
        assert write_rows([], fp, fmt) == 0
    assert path.read_text(encoding="utf-8") == text
    assert read_rows(path) == []


def test_write_rows_rejects_an_unknown_format() -> None:
    with pytest.raises(ValidationError) as caught:
        write_rows([], io.StringIO(), "xml")
    assert caught.value.field == "format"


# --------------------------------------------------------------- the store
def _interval_file(tmp_path: Path, count: int, interval_s: int, **extra: Any) -> Path:
    rows = [{"url": f"https://a.example/{i}", "interval_s": interval_s, "jitter_s": 0, **extra}
            for i in range(count)]
    return _file(tmp_path, "jobs.json", json.dumps(rows, indent=1))


def test_import_file_staggers_first_runs_over_the_interval(
        tmp_path: Path, store: Store) -> None:
    path = _interval_file(tmp_path, 100, interval_s=100)
    before = store.now_ms()
    report, errors = import_file(store, path)
    after = store.now_ms()
    assert (report.total, report.created, report.updated, errors) == (100, 100, 0, [])
    scores = sorted(due_times(store).values())
    assert len(scores) == 100
    assert before <= scores[0] <= after
    # Job i of 100 first runs i seconds in: evenly spread, never a herd.
    gaps = [b - a for a, b in itertools.pairwise(scores)]
    assert all(900 <= gap <= 1100 for gap in gaps), gaps
    assert scores[-1] - scores[0] >= 98_000


def test_re_importing_updates_definitions_but_never_moves_schedules(
        tmp_path: Path, store: Store) -> None:
    import_file(store, _interval_file(tmp_path, 20, interval_s=600))
    first = due_times(store)
    report, _ = import_file(store, _interval_file(tmp_path, 20, interval_s=600,
                                                  meta={"v": 2}))
    assert (report.created, report.updated, report.rescheduled) == (0, 20, 0)
    assert due_times(store) == first
    job = store.get(job_id_for_url("https://a.example/7")).job
    assert job.meta == {"v": 2}


def test_a_failed_import_writes_nothing(tmp_path: Path, store: Store) -> None:
    rows = [{"url": f"https://a.example/{i}"} for i in range(30)]
    rows[17]["cron"] = "every day"
    path = _file(tmp_path, "jobs.json", json.dumps(rows, indent=1))
    with pytest.raises(ImportValidationError) as caught:
        import_file(store, path)
    [error] = caught.value.errors
    assert (error.field, error.row) == ("cron", 2 + 17 * 3)
    assert _store_keys(store) == 0


def test_a_malformed_file_writes_nothing(tmp_path: Path, store: Store) -> None:
    text = "\n".join(json.dumps({"url": f"https://a.example/{i}"}) for i in range(10))
    path = _file(tmp_path, "jobs.jsonl", text + "\n{oops}\n")
    with pytest.raises(ValidationError) as caught:
        import_file(store, path)
    assert caught.value.row == 11
    assert _store_keys(store) == 0


def test_skip_invalid_stores_the_valid_rows_and_returns_the_errors(
        tmp_path: Path, make_store: Callable[..., Store]) -> None:
    store = make_store(timezone="Europe/Berlin")
    path = _file(tmp_path, "jobs.csv", (
        "id,task,cron,interval_s\n"
        "a,t,0 9 * * *,\n"
        "b,t,,-1\n"
        "c,t,,60\n"
    ))
    seen: list[int] = []
    report, errors = import_file(store, path, skip_invalid=True, progress=seen.append)
    assert (report.created, seen) == (2, [2])
    assert [(e.row, e.field) for e in errors] == [(3, "interval_s")]
    assert store.client.hlen(store.keys.defs) == 2
    assert store.get("a").job.timezone == "Europe/Berlin"
