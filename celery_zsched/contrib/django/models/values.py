"""Values between the core and the database: times, the raw-value check, the validation error."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import models
from django.utils import timezone as dj_timezone
from django.utils.hashable import make_hashable

from celery_zsched.core.errors import ValidationError
from celery_zsched.core.timing import ms_to_dt

_SURROGATE = re.compile("[\ud800-\udfff]")


def to_db_datetime(ms: int | None) -> datetime | None:
    """An epoch-ms value as the datetime the database expects under ``USE_TZ``."""
    if ms is None:
        return None
    dt = ms_to_dt(ms)
    # With USE_TZ=False, Django stores naive local time and refuses aware values.
    return dt if django_settings.USE_TZ else dj_timezone.make_naive(dt)


def from_db_datetime(dt: datetime | None) -> datetime | None:
    """A model datetime as an aware datetime (naive ones are in the current time zone)."""
    if dt is None:
        return None
    return dj_timezone.make_aware(dt) if dj_timezone.is_naive(dt) else dt


class JobValidationError(ValidationError, DjangoValidationError):
    """An invalid :class:`ZSchedJob`: raised by ``full_clean()`` and ``save()``.

    It is Django's ``ValidationError`` with an error dict (``message_dict``:
    field -> messages), which forms and the admin show on each field, and at
    the same time :class:`celery_zsched.ValidationError`, whose ``field``,
    ``value`` and ``message`` name the first problem (core field names:
    ``id``, not ``job_id``), as every other entry point reports it.
    """

    def __init__(self, errors: Mapping[str, list[str]], first: ValidationError) -> None:
        ValidationError.__init__(self, first.field, first.value, first.message, first.row)
        # Sets error_dict; its super().__init__ is Exception's in this class's MRO.
        DjangoValidationError.__init__(self, dict(errors))
        self.args = (str(self),)

    # Django hashes (and compares) an error with a ``message`` attribute as a
    # single message with a ``code``: this one is an error dict.
    def __hash__(self) -> int:
        return hash(make_hashable(self.error_dict))

    def __eq__(self, other: object) -> bool:
        return DjangoValidationError.__eq__(self, other)


def raw_value_problem(field: models.Field, value: Any, instance: models.Model) -> str | None:
    """Why ``field.clean(value)`` would raise something other than a ValidationError.

    Also refuses what Django's own cleaning lets through to fail in ``save()``:
    ``None`` in a NOT NULL column (``meta``, ``args``, ``kwargs``) and ``""``
    in a number or date-time column. Anything Django reports itself is left to it.
    """
    if value is None and not field.null:
        # A NOT NULL column: save() would raise IntegrityError.
        empty = '""' if isinstance(field, models.CharField) else "{} or []"
        return f"must not be None (give {empty} for none)"
    if value is None:
        return None
    if isinstance(value, str) and not value and not isinstance(field, models.CharField):
        return "must not be an empty string (give None for none)"
    if isinstance(value, str) and not value.isascii() and _SURROGATE.search(value):
        # Not even a uniqueness query can send one to the database.
        return "must be valid Unicode (it holds a lone surrogate)"
    wrong = f"is not a valid value of this field (a {type(value).__name__})"
    try:
        field.clean(value, instance)
    except DjangoValidationError as exc:
        try:
            # Django formats the value into its message ("“%(value)s” value must
            # be a float."): str() of a 5000-digit int raises, of a blob is huge.
            too_long = any(len(message) > 300 for message in exc.messages)
        except (ValueError, RecursionError, TypeError):
            return wrong
        return wrong if too_long else None
    except RecursionError:
        return "is nested too deeply"
    except OverflowError:
        return "is out of range"
    except (TypeError, ValueError, ArithmeticError):
        return wrong
    return None
