"""The one exception hierarchy of celery-zsched."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
        return ValidationError(self.field, self.value, self.message, row)

    def __str__(self) -> str:
        where = f"row {self.row}: " if self.row is not None else ""
        return f"{where}{self.field}: {self.message} (got {self.value!r})"


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


class BrokerUnavailable(ZSchedError):
    """The Celery broker refused a publish; the claimed jobs were given back."""


class JobFailed(ZSchedError):
    """Raise from a task to report an error, optionally retrying after ``retry_after`` seconds.

    For example an HTTP 429 with a ``Retry-After`` header.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message)
