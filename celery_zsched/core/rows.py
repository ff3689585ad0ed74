"""Rows read from a file become jobs (every row validated first), and jobs become rows.

Shared by ``celery zsched import/export``, the REST API's import and the Django
management commands: either every row of a file is valid, or (with
``skip_invalid``) exactly the rows reported are left out.
"""

from __future__ import annotations

import csv
import json
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

from celery_zsched.core.audit import Actor, local_user
from celery_zsched.core.errors import ImportValidationError, ValidationError
from celery_zsched.core.formats import COLUMNS, FORMATS, Row, gc_paused
from celery_zsched.core.job import Defaults, Job


@dataclass
class ParseResult:
    """Valid jobs in file order, and the errors of the rows left out."""

    jobs: list[Job]
    errors: list[ValidationError]


def parse_rows(rows: Iterable[Row], defaults: Defaults, *,
               skip_invalid: bool = False) -> ParseResult:
    """Validate every row as a job, and check that no id appears twice.

    Each error names the field and the job: its position among the file's
    jobs, its id or URL, and (but for a JSON array) its line. Unless ``skip_invalid``,
    any error raises :class:`ImportValidationError` carrying all of them; with
    it, the invalid rows (and later duplicates of an id) are left out and
    returned in ``errors``.
    """
    jobs: list[Job] = []
    errors: list[ValidationError] = []
    with gc_paused():
        for checked in _checked(rows, defaults):
            if isinstance(checked, Job):
                jobs.append(checked)
            else:
                errors.append(checked)
    if errors and not skip_invalid:
        raise ImportValidationError(errors)
    return ParseResult(jobs, errors)


@dataclass
class SpooledResult:
    """Valid jobs written to a temporary file as their stored JSON, one a line (none of
    them in memory), and the first errors with a count of them all. Close it."""

    spool: IO[bytes]
    count: int = 0
    errors: list[ValidationError] = field(default_factory=list)
    error_count: int = 0

    def jobs(self) -> Iterator[Job]:
        """The jobs, read back one at a time."""
        self.spool.seek(0)
        return (Job.from_json(line) for line in self.spool)

    def close(self) -> None:
        """Remove the temporary file."""
        self.spool.close()


def parse_rows_spooled(rows: Iterable[Row], defaults: Defaults, *,
                       errors_kept: int = 100) -> SpooledResult:
    """:func:`parse_rows` for a file too large to hold as jobs: the same checks, every
    error counted and the first ``errors_kept`` kept, the valid jobs spooled to disk."""
    result = SpooledResult(tempfile.TemporaryFile())  # noqa: SIM115 (closed by close())
    try:
        with gc_paused():
            for checked in _checked(rows, defaults):
                if isinstance(checked, Job):
                    # ASCII JSON (escaped), so one line each.
                    result.spool.write(checked.to_json().encode() + b"\n")
                    result.count += 1
                else:
                    result.error_count += 1
                    if len(result.errors) < errors_kept:
                        result.errors.append(checked)
    except BaseException:
        result.close()
        raise
    return result


def _checked(rows: Iterable[Row], defaults: Defaults) -> Iterator[Job | ValidationError]:
    """Each row as a job, or the error naming it (a later duplicate of an id is one)."""
    from_dict = Job.from_dict
    # id -> (position, line or None): the first job of each id, for duplicates.
    # Not the row itself: rows must not all stay in memory next to the jobs.
    first_job: dict[str, tuple[int, int | None]] = {}
    for number, row in enumerate(rows, 1):
        try:
            job = from_dict(row.data, defaults)
        except ValidationError as exc:
            yield exc.at_row(row.line, job=number, ref=_ref(row.data),
                             line_shown=row.line_shown)
            continue
        seen = first_job.get(job.id)
        if seen is not None:
            at = f" (line {seen[1]})" if seen[1] is not None else ""
            yield ValidationError(
                "id", job.id, f"duplicate id, first as job {seen[0]}{at}", row=row.line,
                job=number, ref=_ref(row.data), line_shown=row.line_shown)
            continue
        first_job[job.id] = (number, row.line if row.line_shown else None)
        yield job


_REF_CHARS = 60


def _ref(data: dict[str, Any]) -> str | None:
    """``id 'a'`` or ``url 'https://…'``: how the file names the job, if it does.

    Only a string is quoted back: a bad id of another type is the error's
    own value, shown once after "got".
    """
    for key in ("id", "url"):
        value = data.get(key)
        if isinstance(value, str) and value:
            short = value if len(value) <= _REF_CHARS else value[:_REF_CHARS] + "..."
            return f"{key} {short!r}"
    return None


def export_row(job: Job) -> dict[str, Any]:
    """``job`` as an import row, keys in :data:`COLUMNS` order (``id`` first)."""
    data = job.to_dict()
    return {k: data[k] for k in COLUMNS if k in data}


def write_rows(jobs: Iterable[Job], fp: TextIO, fmt: str) -> int:
    """Write ``jobs`` to ``fp`` as ``json``, ``jsonl`` or ``csv``; return how many.

    Streams: memory does not grow with the number of jobs. What is written
    re-imports (:func:`read_rows` then :func:`parse_rows`) to equal jobs, under
    any :class:`Defaults`. JSON is an array with one object per line.
    """
    if fmt not in FORMATS:
        raise ValidationError("format", fmt, f"must be one of {', '.join(FORMATS)}")
    dumps = json.JSONEncoder(ensure_ascii=False).encode
    count = 0
    if fmt == "csv":
        writer = csv.writer(fp, lineterminator="\n")
        writer.writerow(COLUMNS)
        for job in jobs:
            data = job.to_dict()
            writer.writerow([_cell(data.get(name)) for name in COLUMNS])
            count += 1
    elif fmt == "jsonl":
        for job in jobs:
            fp.write(dumps(export_row(job)) + "\n")
            count += 1
    else:
        for job in jobs:
            fp.write(("[\n  " if count == 0 else ",\n  ") + dumps(export_row(job)))
            count += 1
        fp.write("\n]\n" if count else "[]\n")
    return count


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    # Numbers via JSON too: repr-exact floats, and meta/args/kwargs cells hold JSON.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def import_actor(path: str | Path) -> Actor:
    """The actor of an import of ``path`` by this process' user: ``user@host:file``."""
    return Actor("import", f"{local_user()}:{Path(path).name}")
