"""Bulk import and export of job definitions as JSON, JSON Lines or CSV.

Shared by ``celery zsched import/export`` and the Django management commands.
An import validates every row before anything is written: either the whole
file goes in, or (with ``skip_invalid``) exactly the rows reported are left out.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import gc
import io
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from celery_zsched.core.errors import FileError, ValidationError
from celery_zsched.core.job import Job

#: Largest file :func:`read_rows` accepts unless told otherwise.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
#: The formats :func:`read_rows` and :func:`write_rows` understand.
FORMATS = ("json", "jsonl", "csv")
#: CSV columns, in the order :func:`write_rows` writes them.
COLUMNS = tuple(f.name for f in fields(Job))

_SUFFIXES = {".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
_COLUMN_SET = frozenset(COLUMNS)
_WS = re.compile(r"[ \t\n\r]*")
_SNIPPET = 80


@dataclass(frozen=True, slots=True)
class Row:
    """One definition as read from a file; ``line`` is the 1-based line where it starts.

    ``line_shown`` is false for the elements of a JSON array: errors then name
    the job by its position and id only, as the whole array may be one line.
    It is not part of equality: two rows are equal when they hold the same job.
    """

    line: int
    data: dict[str, Any]
    line_shown: bool = field(default=True, compare=False)


def detect_format(path: str | Path, fmt: str | None = None) -> str:
    """``fmt`` if given, else the format named by the file's suffix.

    Raises :class:`ValidationError` (field ``format``) for anything else.
    """
    if fmt is None:
        suffix = Path(path).suffix.lower()
        if suffix not in _SUFFIXES:
            raise ValidationError(
                "format", str(path),
                f"cannot tell the format from the suffix {suffix!r}; "
                f"give one of {', '.join(FORMATS)}")
        return _SUFFIXES[suffix]
    if fmt not in FORMATS:
        raise ValidationError("format", fmt, f"must be one of {', '.join(FORMATS)}")
    return fmt


def read_rows(path: str | Path, fmt: str | None = None, *,
              max_bytes: int = DEFAULT_MAX_BYTES) -> list[Row]:
    """Every row of a JSON array, JSON Lines or CSV file, with its line number.

    Rows are not validated as jobs (see :func:`parse_rows`). A file that cannot
    be read, is larger than ``max_bytes``, is not UTF-8, is malformed (nested
    too deeply included), is not an array of objects, or has unknown CSV
    columns raises :class:`~celery_zsched.core.errors.FileError` (a
    :class:`ValidationError`) naming the field (``file`` or the column) and,
    as ``row``, the line.
    """
    with gc_paused():
        return list(iter_rows(path, fmt, max_bytes=max_bytes))


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while many small objects are built."""
    # Building a million rows or jobs creates no garbage cycles, but it does
    # trigger many full collections that each walk every object built so far:
    # pausing the collector halves the time of a large import.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def iter_rows(path: str | Path, fmt: str | None = None, *,
              max_bytes: int = DEFAULT_MAX_BYTES) -> Iterator[Row]:
    """:func:`read_rows` one row at a time, for imports too large to hold twice.

    The file is read (and size, readability and encoding checked) before this
    returns; errors in its content are raised as iteration reaches them.
    """
    fmt = detect_format(path, fmt)
    return text_rows(_read_text(Path(path), max_bytes), fmt)


def text_rows(text: str, fmt: str) -> Iterator[Row]:
    """The rows of ``text``, a whole file's content in format ``fmt`` (as :func:`iter_rows`)."""
    if fmt == "json":
        return _json_rows(text)
    if fmt == "jsonl":
        return _jsonl_rows(text)
    if fmt == "csv":
        return _csv_rows(text)
    raise ValidationError("format", fmt, f"must be one of {', '.join(FORMATS)}")


def stream_rows(fp: IO[bytes], fmt: str, name: str) -> Iterator[Row]:
    """The rows of a file open for reading in binary, as :func:`text_rows` reads them, without
    ever holding the whole text: for bodies too large to hold several times (the REST
    API's import). Its encoding is checked first, so a file that is not UTF-8 is refused
    before its first row (:class:`FileError` naming ``name`` and the line)."""
    if fmt not in FORMATS:
        raise ValidationError("format", fmt, f"must be one of {', '.join(FORMATS)}")
    _check_utf8(fp, name)
    fp.seek(0)
    # jsonl splits at "\n" only (JSON strings may hold a raw U+2028); csv and json
    # see the text as it is, line ends included.
    text = io.TextIOWrapper(fp, encoding="utf-8-sig", newline="\n" if fmt == "jsonl" else "")
    try:
        if fmt == "json":
            yield from _json_stream(text.read)
        elif fmt == "jsonl":
            yield from _jsonl_lines(text)
        else:
            yield from _csv_lines(text)
    finally:
        text.detach()  # the caller's file stays open


def _check_utf8(fp: IO[bytes], name: str) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")()
    lines = offset = 0
    for chunk in iter(lambda: fp.read(1 << 20), b""):
        try:
            decoder.decode(chunk)
        except UnicodeDecodeError as exc:
            # exc.object: the bytes the decoder held back from the chunk before, then this one.
            start = offset + len(chunk) - len(exc.object) + exc.start
            line = lines + exc.object.count(b"\n", 0, exc.start) + 1
            raise FileError("file", name, f"is not UTF-8 at line {line} (byte {start})",
                            row=line) from exc
        lines += chunk.count(b"\n")
        offset += len(chunk)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        raise FileError("file", name, f"is not UTF-8 at line {lines + 1} (its end)",
                        row=lines + 1) from exc


def _read_text(path: Path, max_bytes: int) -> str:
    try:
        with open(path, "rb") as fp:
            size = os.fstat(fp.fileno()).st_size
            if size > max_bytes:
                raise FileError(
                    "file", str(path), f"is {size} bytes, over the limit of {max_bytes}")
            # A pipe or FIFO reports size 0: the bounded read is the real guard.
            raw = fp.read(max_bytes + 1)
    except OSError as exc:
        raise FileError("file", str(path), f"cannot be read: {exc.strerror or exc}") from exc
    if len(raw) > max_bytes:
        raise FileError("file", str(path), f"is over the limit of {max_bytes} bytes")
    return decode_text(raw, str(path))


def decode_text(raw: bytes, name: str) -> str:
    """A file's bytes as text; :class:`FileError` naming ``name`` and the line if not UTF-8."""
    try:
        # utf-8-sig: spreadsheet programs put a BOM in front of CSV exports.
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise FileError("file", name, f"is not UTF-8 at line {line} (byte {exc.start})",
                        row=line) from exc


def _snippet(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start:end if end >= 0 else len(text)].strip()[:_SNIPPET]


def _malformed(exc: json.JSONDecodeError, text: str, line_offset: int = 0,
               col_offset: int = 0) -> FileError:
    line = exc.lineno + line_offset
    return FileError(
        "file", _snippet(text, exc.pos),
        f"malformed JSON at line {line}, column {exc.colno + col_offset}: {exc.msg}", row=line)


def _undecodable(exc: RecursionError | ValueError, text: str, pos: int, line: int
                 ) -> FileError:
    """A JSON value json refused with something other than a JSONDecodeError."""
    if isinstance(exc, RecursionError):
        what = "nested too deeply (more levels of [ and { than Python can read)"
    else:  # "Exceeds the limit (4300 digits) for integer string conversion"
        what = str(exc).split(";")[0]
    return FileError("file", _snippet(text, pos), f"malformed JSON at line {line}: {what}",
                     row=line)


# A JSON value of each Python type, for "line 3 is a JSON string, not an object".
_JSON_TYPE = {str: "string", list: "array", int: "number", float: "number", bool: "boolean",
              type(None): "null"}


def _not_an_object(value: Any, line: int) -> FileError:
    kind = _JSON_TYPE.get(type(value), "value")
    return FileError("file", _short(value),
                     f"line {line} is a JSON {kind}, not an object: each row must be one "
                     "JSON object of job fields", row=line)


def _short(value: Any) -> Any:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (ValueError, RecursionError):  # an int over 4300 digits, or deep nesting
        return f"<a JSON {_JSON_TYPE.get(type(value), 'value')}>"
    return value if len(text) <= _SNIPPET else text[:_SNIPPET] + "..."


def _decode(decode: Callable[..., Any], text: str, *args: Any, line: int = 1,
            line_offset: int = 0) -> Any:
    """``decode(text, *args)``, every failure a :class:`FileError` naming the line."""
    try:
        return decode(text, *args)
    except json.JSONDecodeError as exc:
        raise _malformed(exc, text, line_offset) from exc
    # RecursionError: deep nesting; ValueError: an int over 4300 digits.
    except (RecursionError, ValueError) as exc:
        pos = args[0] if args else 0
        raise _undecodable(exc, text, pos, line) from exc


def _skip_ws(text: str, pos: int) -> int:
    match = _WS.match(text, pos)
    return match.end() if match else pos


class _Window:
    """A JSON array's text read a chunk at a time: the unread part of the text and
    where it is (the line and column of its first character)."""

    def __init__(self, read: Callable[[int], str]) -> None:
        self.read, self.buf, self.pos, self.eof = read, "", 0, False
        self.line, self.col = 1, 0

    def more(self) -> bool:
        """Read the next chunk (dropping what was parsed); ``False`` at the end."""
        if self.eof or len(self.buf) - self.pos > _JSON_ELEMENT_MAX:
            return False  # nothing more, or one element past any job's size
        chunk = self.read(_JSON_CHUNK)
        if not chunk:
            self.eof = True
            return False
        done = self.buf[:self.pos]
        newlines = done.count("\n")
        self.line += newlines
        self.col = len(done) - done.rfind("\n") - 1 if newlines else self.col + len(done)
        self.buf, self.pos = self.buf[self.pos:] + chunk, 0
        return True

    def skip_ws(self) -> str:
        """Skip whitespace; the character after it ("" at the end)."""
        while True:
            self.pos = _skip_ws(self.buf, self.pos)
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos:self.pos + 1]

    def line_at(self, pos: int) -> int:
        return self.line + self.buf.count("\n", 0, pos)

    def value(self, decode: Callable[..., Any]) -> tuple[Any, int]:
        """The JSON value here, and the line it starts on."""
        while True:
            line = self.line_at(self.pos)
            try:
                value, end = decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self.more():
                    continue  # it may only be cut at the chunk's end
                raise self.malformed(exc) from exc
            except (RecursionError, ValueError) as exc:
                raise _undecodable(exc, self.buf, self.pos, line) from exc
            if end == len(self.buf) and self.more():
                continue  # a number may go on in the next chunk
            self.pos = end
            return value, line

    def malformed(self, exc: json.JSONDecodeError) -> FileError:
        return _malformed(exc, self.buf, self.line - 1,
                          col_offset=self.col if exc.lineno == 1 else 0)


#: Characters of a JSON array read at a time, and the largest element it holds
#: whole (a job's JSON is far smaller: meta, args and kwargs are 1 MiB at most).
_JSON_CHUNK, _JSON_ELEMENT_MAX = 1 << 20, 8 << 20


def _json_rows(text: str) -> Iterator[Row]:
    return _json_stream(io.StringIO(text).read)


def _json_stream(read: Callable[[int], str]) -> Iterator[Row]:
    # One raw_decode per element rather than json.loads of the whole array: the C
    # scanner stays fast, we learn the line each object starts on, and only a
    # window of the text is ever held (a 64 MiB body is never one string).
    decode = json.JSONDecoder().raw_decode
    text = _Window(read)
    if text.skip_ws() != "[":
        value, line = text.value(lambda s, pos: (json.loads(s[pos:]), len(s)))
        kind = "an object" if type(value) is dict else f"a JSON {_JSON_TYPE.get(type(value))}"
        raise FileError("file", _short(value),
                        f"must be a JSON array of objects, not {kind} (line {line})", row=line)
    text.pos += 1
    if text.skip_ws() == "]":
        text.pos += 1
    else:
        while True:
            value, line = text.value(decode)
            if type(value) is not dict:
                raise _not_an_object(value, line)
            yield Row(line, value, False)
            sep = text.skip_ws()
            text.pos += 1
            if sep == ",":
                text.skip_ws()
            elif sep == "]":
                break
            else:
                what = "Expecting ',' delimiter" if sep else "Unterminated array"
                raise text.malformed(json.JSONDecodeError(what, text.buf, text.pos - 1))
    if text.skip_ws():
        raise text.malformed(json.JSONDecodeError("Extra data after the array", text.buf,
                                                  text.pos))


def _jsonl_rows(text: str) -> Iterator[Row]:
    # split("\n"), not splitlines(): JSON strings may hold a raw U+2028.
    return _jsonl_lines(text.split("\n"))


def _jsonl_lines(lines: Iterable[str]) -> Iterator[Row]:
    loads = json.loads
    for line, raw in enumerate(lines, 1):
        if not raw or raw.isspace():
            continue
        value = _decode(loads, raw, line=line, line_offset=line - 1)
        if type(value) is not dict:
            raise _not_an_object(value, line)
        yield Row(line, value)


def _csv_rows(text: str) -> Iterator[Row]:
    return _csv_lines(io.StringIO(text, newline=""))


def _csv_lines(lines: Iterable[str]) -> Iterator[Row]:
    reader = csv.reader(lines)
    try:
        header = next(reader, None)
        if header is None:
            return
        columns = _csv_header(header)
        width = len(columns)
        done = reader.line_num
        for record in reader:
            # A quoted cell may span lines: a record starts after the last one ended.
            line, done = done + 1, reader.line_num
            if not record:
                continue
            if len(record) > width and any(record[width:]):
                raise FileError(
                    "file", _short(record),
                    f"line {line} has {len(record)} cells but the header has {width} "
                    f"column{'s' if width != 1 else ''}", row=line)
            yield Row(line, {k: v for k, v in zip(columns, record, strict=False) if v})
    except csv.Error as exc:  # includes a cell over csv.field_size_limit()
        raise FileError("file", None, f"malformed CSV at line {reader.line_num}: {exc}",
                        row=reader.line_num) from exc


def _csv_header(header: list[str]) -> list[str]:
    columns = [name.strip() for name in header]
    seen: set[str] = set()
    for name in columns:
        if name not in _COLUMN_SET:
            raise FileError(name, name, "unknown column in the header (line 1); known: "
                                        f"{', '.join(COLUMNS)}", row=1)
        if name in seen:
            raise FileError(name, name, "duplicate column in the header (line 1)", row=1)
        seen.add(name)
    return columns
