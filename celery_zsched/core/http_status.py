"""The HTTP status and Retry-After an exception carries, whichever client raised it.

Tasks report these so pacing can learn from a site's answers. Most HTTP
clients put them on their errors in one of a few places: ``requests`` and
``httpx`` on ``exc.response`` (``status_code``, ``headers``), ``urllib`` on the
error itself (``code``, ``headers``), aiohttp as ``status``. Anything else
reports no status.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any


def _int_status(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 100 <= value <= 599 else None


def status_of(exc: BaseException) -> int | None:
    """The HTTP status ``exc`` carries, or ``None``."""
    for holder in (exc, getattr(exc, "response", None)):
        if holder is None:
            continue
        for name in ("status", "status_code", "code"):
            found = _int_status(getattr(holder, name, None))
            if found is not None:
                return found
    return None


def parse_retry_after(value: Any, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` value: delay-seconds or an HTTP date (RFC 9110)."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return max(0.0, float(value))
    text = str(value).strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retry_after_of(exc: BaseException) -> float | None:
    """Seconds ``exc`` asks to wait: its ``retry_after``, else its response's header."""
    explicit = getattr(exc, "retry_after", None)
    if explicit is not None:
        return parse_retry_after(explicit)
    for holder in (exc, getattr(exc, "response", None)):
        headers = getattr(holder, "headers", None) if holder is not None else None
        if headers is not None and hasattr(headers, "get"):
            found = parse_retry_after(_header(headers, "Retry-After"))
            if found is not None:
                return found
    return None


def _header(headers: Any, name: str) -> Any:
    value = headers.get(name)
    if value is None and isinstance(headers, Mapping):
        # A plain dict is case-sensitive; HTTP header names are not.
        value = next((v for k, v in headers.items() if str(k).lower() == name.lower()), None)
    return value
