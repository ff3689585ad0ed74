"""The one exception hierarchy of celery-zsched."""

from __future__ import annotations

import reprlib
from collections.abc import Sequence
from typing import Any

# Values in messages are shortened: a bad value may be megabytes long, nested
# past the recursion limit, or an int that repr() refuses (over 4300 digits).
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlong = 40
_REPR.maxlevel = 3


def show_value(value: Any) -> str:
    """``repr(value)``, at most about 100 characters, and never raising."""
    try:
        return _REPR.repr(value)
    except ValueError:  # an int past sys.get_int_max_str_digits()
        if isinstance(value, int):
            return f"<an integer of {value.bit_length()} bits>"
        return f"<a {type(value).__name__}>"
    except Exception:  # a foreign object whose __repr__ fails: name its type only
        return f"<a {type(value).__name__}>"


def got(value: Any) -> str:
    """`` (got 'x')``, what a message ends with; empty for None, which says nothing."""
    return "" if value is None else f" (got {show_value(value)})"


class ZSchedError(Exception):
    """Base class of every error this package raises on purpose."""


class ValidationError(ZSchedError, ValueError):
    """A job definition or setting is invalid.

    ``field`` names the offending field and ``value`` is what was given. When
    the definition came from a file, ``row`` is the 1-based line it starts on,
    ``job`` its 1-based position among the file's jobs and ``ref`` the id or
    URL it gives (shortened), so a message reads ``job 4 (line 5, id 'a'):``.
    ``line_shown`` is false for a JSON array: there the line is left out of
    the message, since a one-line array puts every job on line 1.
    """

    def __init__(self, field: str, value: Any, message: str, row: int | None = None, *,
                 job: int | None = None, ref: str | None = None,
                 line_shown: bool = True) -> None:
        self.field = field
        self.value = value
        self.message = message
        self.row = row
        self.job = job
        self.ref = ref
        self.line_shown = line_shown
        super().__init__(str(self))

    def at_row(self, row: int, *, job: int | None = None, ref: str | None = None,
               line_shown: bool = True) -> ValidationError:
        """Return a copy of this error attributed to line ``row`` (and to the file's ``job``)."""
        return type(self)(self.field, self.value, self.message, row, job=job, ref=ref,
                          line_shown=line_shown)

    def where(self) -> str:
        """``job 4 (line 5, id 'a')``, ``line 5`` or ``""``: what the message starts with."""
        if self.job is None:
            return f"line {self.row}" if self.row is not None else ""
        parts = [f"line {self.row}"] if self.line_shown and self.row is not None else []
        if self.ref:
            parts.append(self.ref)
        return f"job {self.job} ({', '.join(parts)})" if parts else f"job {self.job}"

    def __str__(self) -> str:
        where = self.where()
        return f"{where + ': ' if where else ''}{self.field}: {self.message}{got(self.value)}"


class FileError(ValidationError):
    """A whole import file is unusable: unreadable, too large, not UTF-8, malformed JSON
    or CSV, not an array of objects, or a bad CSV header.

    ``field`` is ``file`` (or the CSV column at fault) and ``row`` the 1-based
    line of the problem, as for any :class:`ValidationError`; the message says
    "line", never "row", because no job row is at fault: the file is.
    """

    def __str__(self) -> str:
        return f"{self.field}: {self.message}{got(self.value)}"


class ImportValidationError(ZSchedError):
    """An import was rejected because some rows are invalid; nothing was written."""

    def __init__(self, errors: Sequence[ValidationError]) -> None:
        self.errors = list(errors)
        lines = "\n".join(f"  {e}" for e in self.errors[:50])
        more = f"\n  ... and {len(self.errors) - 50} more" if len(self.errors) > 50 else ""
        super().__init__(f"{len(self.errors)} invalid job(s), nothing was written:\n{lines}{more}")


class ConfigurationError(ZSchedError):
    """A ``zsched_*`` setting is unknown or has an invalid value."""


class JobNotFound(ZSchedError, KeyError):
    """No job with the given id exists in the store."""

    def __str__(self) -> str:
        return f"no such job: {self.args[0]!r}"


class StoreUnavailable(ZSchedError):
    """Redis could not be reached; the operation did not happen and can be retried."""


class LayoutMismatch(StoreUnavailable):
    """The store's partition count is not ``zsched_partitions`` (or it is being changed).

    A process that sees it touches nothing: it waits and retries like for an
    outage, logging this message, until its settings or the store agree.
    """


class BrokerUnavailable(ZSchedError):
    """The Celery broker refused a publish; the claimed jobs were given back."""


class JobFailed(ZSchedError):
    """Raise from a task to report an error, optionally retrying after ``retry_after`` seconds.

    For example an HTTP 429 with a ``Retry-After`` header:
    ``raise JobFailed("HTTP 429", status=429, retry_after=120)``. With pacing on,
    ``status`` and ``retry_after`` also slow down or close the job's domain.
    ``changed``, ``signature``, ``etag`` and ``last_modified`` report what the
    fetch saw of the page, as :func:`celery_zsched.worker.report` does.
    """

    def __init__(self, message: str, retry_after: float | None = None,
                 status: int | None = None, *, changed: bool | None = None,
                 signature: str | None = None, etag: str | None = None,
                 last_modified: str | None = None) -> None:
        self.retry_after = retry_after
        self.status = status
        self.changed, self.signature = changed, signature
        self.etag, self.last_modified = etag, last_modified
        super().__init__(message)
