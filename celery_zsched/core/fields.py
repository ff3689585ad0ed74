"""Checks of single fields of a job definition: each value validated and normalised,
or refused with a :class:`~celery_zsched.core.errors.ValidationError` naming it.

The limits keep every accepted job storable everywhere it goes: Redis, a Celery
message, the Django model (its max_length and integer columns), an export, and a
message that quotes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import numbers
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery_zsched.core.errors import ValidationError
from celery_zsched.core.timing import (
    UTC,
    dt_to_ms,
)

# \Z, not $: "$" also matches before a final newline, which let "job\n" pass.
_ID_RE = re.compile(r"^[A-Za-z0-9_.:@/\-]{1,200}\Z")
TIME_FIELDS = ("run_at", "start_at", "end_at")


def job_id_for_url(url: str) -> str:
    """The default id of a URL job: the first 12 hex digits of SHA-1 of the URL."""
    return hashlib.sha1(url.encode("utf-8")).hexdigest()[:12]


def id_problem(job_id: Any) -> str | None:
    """Why ``job_id`` cannot be a job id, or ``None``.

    Besides the characters: an id goes into URL paths (the REST API, the job
    gateway, the admin), where clients and proxies rewrite ``.`` and ``..``
    segments and merge ``//`` (``a/../b`` would name ``b``), and where a last
    segment ``executions`` names the runs route. Such ids are refused.
    """
    if not isinstance(job_id, str) or not _ID_RE.match(job_id):
        return "must be 1-200 characters of A-Z a-z 0-9 _ . : @ / -"
    segments = job_id.split("/")
    if any(segment in ("", ".", "..") for segment in segments):
        return ("must not start or end with /, hold //, or have a . or .. segment "
                "(URL paths would rewrite it)")
    if len(segments) > 1 and segments[-1] == "executions":
        return "must not end in /executions (the REST API's route of a job's runs)"
    return None
#: Who may run a job: Celery workers (through beat) or HTTP workers (the gateway).
TRANSPORTS = ("celery", "http")
#: How an interval job's interval is chosen: as written, or from its change rate.
RECRAWL_MODES = ("fixed", "adaptive")
_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


# 10000-01-01T00:00:00Z: later times cannot be shown as ISO 8601 (export, show).
MAX_EPOCH_S = 253_402_300_800
MAX_EPOCH_MS = MAX_EPOCH_S * 1000


# Limits that keep every accepted job storable everywhere it goes: Redis, a
# Celery message, the Django model (its max_length and integer columns), an
# export, and a message that quotes it.
#: Longest text of each field: the Django model's max_length.
MAX_LEN = {"name": 200, "task": 200, "queue": 200, "routing_key": 200, "url": 2000,
            "cron": 120, "timezone": 64}
#: Longest duration (interval, jitter, expiry, grace, retry base): 100 years,
#: so now + interval + jitter is always a due time before year 10000.
_MAX_SECONDS = 3_155_760_000
#: Largest ``max_runs``: what a SQL integer column (PositiveIntegerField) holds.
_MAX_INT = 2**31 - 1
#: Deepest meta/args/kwargs, and their largest JSON encoding.
MAX_DEPTH = 32
MAX_JSON_CHARS = 1 << 20
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")
SURROGATE = re.compile("[\ud800-\udfff]")
# A \u0000 escape in JSON text (its backslash not itself escaped).
NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_URL_SPACE = re.compile(r"[\s\x00-\x1f\x7f]")
# A netloc with a user, a port or an IPv6 host: the ones urlsplit parses further.
_URL_HOST_EXTRAS = re.compile(r"[@:\[\]]")


def text_problem(value: str, limit: int | None) -> str | None:
    """Why a text cannot be stored (too long, NUL, lone surrogate), or None."""
    if not value:
        return None
    if limit is not None and len(value) > limit:
        return f"must be at most {limit} characters, not {len(value):,}"
    if value.isascii():  # the common case, and a cheap test
        return "must not contain NUL characters" if "\x00" in value else None
    found = _BAD_CHAR.search(value)
    if found is None:
        return None
    if found.group() == "\x00":
        return "must not contain NUL characters"
    # Surrogates cannot be encoded as UTF-8: Redis, SQL and the broker would refuse them.
    return "must be valid Unicode (it holds a lone surrogate)"


def url(value: Any) -> str:
    if not isinstance(value, str):
        raise ValidationError("url", value, "must be a string")
    url = value.strip()
    problem = text_problem(url, MAX_LEN["url"])
    if problem:
        raise ValidationError("url", value, problem)
    # urlsplit silently drops tabs and newlines, so look for them first.
    if _URL_SPACE.search(url):
        raise ValidationError("url", value, "must not contain spaces or control characters")
    try:
        parts = urlsplit(url)  # ValueError: "Invalid IPv6 URL" for http://[::1
        host = parts.netloc
        # Only a netloc with a user, a port or an IPv6 host needs parsing further
        # (a plain "example.com" is the common case, and cheap).
        if _URL_HOST_EXTRAS.search(host):
            parts.port  # noqa: B018  -- raises ValueError for a port out of 0-65535
            host = parts.hostname or ""
    except ValueError as exc:
        raise ValidationError("url", value, f"must be an absolute http(s) URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise ValidationError("url", value, "must be an absolute http(s) URL")
    return url


def timezone(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError("timezone", value, "must be an IANA time zone name")
    if text_problem(value, MAX_LEN["timezone"]):
        raise ValidationError("timezone", value, "unknown IANA time zone")
    try:
        ZoneInfo(value)
    # OSError: a folder of the zone database ("Europe" -> IsADirectoryError),
    # or a name the file system refuses.
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValidationError("timezone", value, "unknown IANA time zone") from exc
    return value


def number(values: Mapping[str, Any], name: str, minimum: float) -> float | None:
    """A duration in seconds, finite, from ``minimum`` to 100 years."""
    raw = values.get(name)
    if raw is None:
        return None
    try:
        if isinstance(raw, bool):
            raise TypeError
        number = float(raw)
    # OverflowError: an int past any float (10**400, valid JSON).
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationError(name, raw, "must be a number") from exc
    if not math.isfinite(number) or number < minimum:
        raise ValidationError(name, raw, f"must be a finite number >= {minimum:g}")
    if number > _MAX_SECONDS:
        raise ValidationError(name, raw, f"must be at most {_MAX_SECONDS:,} (100 years)")
    return number


def integer(values: Mapping[str, Any], name: str, low: int, high: int | None) -> int | None:
    """An integer from ``low`` to ``high`` (``None``: the largest a SQL integer column holds)."""
    raw = values.get(name)
    if raw is None:
        return None
    high = _MAX_INT if high is None else high
    number: int | None = None
    if isinstance(raw, bool):
        pass
    # is_integer() is False for NaN and the infinities.
    elif isinstance(raw, numbers.Integral) or (isinstance(raw, float) and raw.is_integer()):
        number = int(raw)
    elif isinstance(raw, str):
        # int() of over 4300 digits raises ValueError too; a bound is all we need.
        with contextlib.suppress(ValueError):
            number = int(raw)
    if number is None:
        raise ValidationError(name, raw, "must be an integer")
    if not low <= number <= high:
        raise ValidationError(name, raw, f"must be between {low} and {high}")
    return number


def boolean(values: Mapping[str, Any], name: str) -> bool:
    raw = values.get(name, True)
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    text = raw.strip().lower() if isinstance(raw, str) else None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValidationError(name, raw, "must be true or false")


def text(values: Mapping[str, Any], name: str) -> str:
    raw = values.get(name, "")
    if not isinstance(raw, str):
        raise ValidationError(name, raw, "must be a string")
    problem = text_problem(raw, MAX_LEN.get(name))
    if problem:
        raise ValidationError(name, raw, problem)
    return raw


def opt_text(values: Mapping[str, Any], name: str) -> str | None:
    return text(values, name) or None


def container(values: Mapping[str, Any], name: str, kind: type) -> Any:
    raw = values.get(name, kind())
    if isinstance(raw, str):  # a CSV cell or a form field holding JSON
        if len(raw) > MAX_JSON_CHARS:
            raise ValidationError(name, raw, f"must be at most {MAX_JSON_CHARS:,} characters "
                                             "as JSON")
        try:
            raw = json.loads(raw)
        except RecursionError as exc:  # json recurses once per level of nesting
            raise ValidationError(name, raw, f"must be nested at most {MAX_DEPTH} levels "
                                             "deep") from exc
        except ValueError as exc:  # malformed, or an int over 4300 digits
            raise ValidationError(name, raw, f"must be a JSON {kind.__name__}") from exc
    if not isinstance(raw, kind):
        raise ValidationError(name, raw, f"must be a {'list' if kind is list else 'JSON object'}")
    return raw


def time_field(values: Mapping[str, Any], name: str, tz: ZoneInfo) -> int | None:
    """An ISO 8601 string (naive = the job's zone) or epoch seconds, as epoch ms."""
    raw = values.get(name)
    if raw is None:
        return None
    if isinstance(raw, datetime):
        dt = raw
    elif isinstance(raw, int | float) and not isinstance(raw, bool):
        # A chained comparison, not float(): it is exact for 10**400 and false for NaN.
        if not 0 <= raw < MAX_EPOCH_S:
            raise ValidationError(name, raw, "must be a non-negative epoch time before year 10000")
        return int(raw * 1000)
    elif isinstance(raw, str):
        try:
            dt = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise ValidationError(name, raw, "must be an ISO 8601 date-time") from exc
    else:
        raise ValidationError(name, raw, "must be an ISO 8601 date-time or epoch seconds")
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=tz)
    try:
        ms = dt_to_ms(dt.astimezone(UTC))
    # OverflowError: 9999-12-31T23:00-05:00 is past datetime.max in UTC (and
    # 0001-01-01T00:00+01:00 before datetime.min); ValueError, TypeError: a
    # foreign tzinfo with a bad utcoffset().
    except (OverflowError, ValueError, TypeError) as exc:
        raise ValidationError(name, raw, _TIME_RANGE) from exc
    # The same range as epoch seconds: before 1970 a due time is negative, which
    # exports and the Django admin do not expect.
    if not 0 <= ms < MAX_EPOCH_MS:
        raise ValidationError(name, raw, _TIME_RANGE)
    return ms


_TIME_RANGE = "must be from 1970-01-01 to 9999-12-31 (UTC)"
