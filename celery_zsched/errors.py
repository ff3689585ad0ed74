"""The one exception hierarchy of celery-zsched."""

from __future__ import annotations

import contextlib
import reprlib
from collections.abc import Iterator, Sequence
from typing import Any

import redis

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


class ZSchedError(Exception):
    """Base class of every error this package raises on purpose."""


class ValidationError(ZSchedError, ValueError):
    """A job definition or setting is invalid.

    ``field`` names the offending field, ``value`` is what was given and
    ``row`` (when the definition came from a file) is its 1-based row or line.
    """

    def __init__(self, field: str, value: Any, message: str, row: int | None = None) -> None:
        self.field = field
        self.value = value
        self.message = message
        self.row = row
        super().__init__(str(self))

    def at_row(self, row: int) -> ValidationError:
        """Return a copy of this error attributed to ``row``."""
        return type(self)(self.field, self.value, self.message, row)

    def __str__(self) -> str:
        where = f"row {self.row}: " if self.row is not None else ""
        return f"{where}{self.field}: {self.message} (got {show_value(self.value)})"


class FileError(ValidationError):
    """A whole import file is unusable: unreadable, too large, not UTF-8, malformed JSON
    or CSV, not an array of objects, or a bad CSV header.

    ``field`` is ``file`` (or the CSV column at fault) and ``row`` the 1-based
    line of the problem, as for any :class:`ValidationError`; the message says
    "line", never "row", because no job row is at fault: the file is.
    """

    def __str__(self) -> str:
        return f"{self.field}: {self.message} (got {show_value(self.value)})"


class ImportValidationError(ZSchedError):
    """An import was rejected because some rows are invalid; nothing was written."""

    def __init__(self, errors: Sequence[ValidationError]) -> None:
        self.errors = list(errors)
        lines = "\n".join(f"  {e}" for e in self.errors[:50])
        more = f"\n  ... and {len(self.errors) - 50} more" if len(self.errors) > 50 else ""
        super().__init__(f"{len(self.errors)} invalid row(s), nothing was written:\n{lines}{more}")


class ConfigurationError(ZSchedError):
    """A ``zsched_*`` setting is unknown or has an invalid value."""


class JobNotFound(ZSchedError, KeyError):
    """No job with the given id exists in the store."""

    def __str__(self) -> str:
        return f"no such job: {self.args[0]!r}"


class StoreUnavailable(ZSchedError):
    """Redis could not be reached; the operation did not happen and can be retried."""


@contextlib.contextmanager
def redis_unavailable() -> Iterator[None]:
    """Turn Redis connection failures into :class:`StoreUnavailable` (the one translation)."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise StoreUnavailable(f"Redis unreachable: {exc}") from exc


class BrokerUnavailable(ZSchedError):
    """The Celery broker refused a publish; the claimed jobs were given back."""


class JobFailed(ZSchedError):
    """Raise from a task to report an error, optionally retrying after ``retry_after`` seconds.

    For example an HTTP 429 with a ``Retry-After`` header.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message)
