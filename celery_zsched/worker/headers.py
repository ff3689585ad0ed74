"""What the zsched headers of a task message say, checked.

Beat writes them; anything else that reaches a worker (a stray message, a
forged one) may carry anything, so every value is bounded before the store
sees it, and a message whose headers cannot be trusted is named, not run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Occurrence:
    """What the headers of a zsched message say."""

    job_id: str
    occurrence: int
    attempt: int
    due_ms: int
    promoted_ms: int
    expires_ms: int | None = None
    #: Which publish of this attempt the message is (``None``: a message from
    #: before fencing); start accepts only one beat made.
    delivery: int | None = None
    #: Where beat claimed it (``"index@layout"``, ``None``: not said): see
    #: :meth:`~celery_zsched.store.Store.learn_header`.
    partition: str | None = None


class MalformedHeaders(ValueError):
    """A message carries a ``zsched_job_id`` but its other zsched headers are not valid."""


#: Bounds of the integer headers: epoch ms and counts, never beyond what a
#: JSON number (and the run history's columns) hold exactly.
_MAX_MS = 2**53 - 1
_MAX_COUNT = 1_000_000


def _header_int(get: Callable[[str], Any], name: str, low: int, high: int,
                default: int | None) -> int | None:
    value = get(name)
    if value is None:
        if default is None and name in _REQUIRED:
            raise MalformedHeaders(f"{name} is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise MalformedHeaders(f"{name} must be an integer in [{low}, {high}], got {value!r:.40}")
    return value


_REQUIRED = ("zsched_occurrence", "zsched_attempt")


def occurrence_of(headers: Any) -> Occurrence | None:
    """Parse zsched headers from a mapping or an object with attributes.

    ``None`` when there are none (not a zsched message); raises
    :class:`MalformedHeaders` when a ``zsched_job_id`` comes with headers that
    are missing, mistyped or out of range.
    """
    def get(name: str) -> Any:
        if isinstance(headers, dict):
            return headers.get(name)
        return getattr(headers, name, None)
    job_id = get("zsched_job_id")
    if job_id is None or job_id == "":
        return None
    if not isinstance(job_id, str) or len(job_id) > 200:
        raise MalformedHeaders(f"zsched_job_id must be a job id, got {job_id!r:.40}")
    occurrence = _header_int(get, "zsched_occurrence", 0, _MAX_MS, None)
    attempt = _header_int(get, "zsched_attempt", 1, _MAX_COUNT, None)
    due = _header_int(get, "zsched_due_ms", 0, _MAX_MS, 0)
    promoted = _header_int(get, "zsched_promoted_ms", 0, _MAX_MS, 0)
    expires = _header_int(get, "zsched_expires_ms", 0, _MAX_MS, None)
    delivery = _header_int(get, "zsched_delivery", 1, _MAX_COUNT, None)
    assert occurrence is not None and attempt is not None  # required: raised above
    partition = get("zsched_partition")
    # Only a hint (a wrong one finds nothing and the directory decides): bounded, not trusted.
    hint = partition if isinstance(partition, str) and len(partition) <= 40 else None
    return Occurrence(job_id, occurrence, attempt, due or 0, promoted or 0, expires, delivery,
                      hint)


#: Where a request keeps its parsed occurrence: every hook of an execution asks.
_PARSED = "zsched_parsed"


def from_request(request: Any) -> Occurrence | None:
    """The occurrence of ``request``; raises :class:`MalformedHeaders` for bad headers."""
    if request is None:
        return None
    # Named by the request's identity: Celery copies a request's attributes into
    # the context of a task called from inside it, whose headers may differ.
    parsed = getattr(request, _PARSED, None)
    if parsed is not None and parsed[0] == id(request):
        return parsed[1]  # type: ignore[no-any-return]
    found = None
    for source in (getattr(request, "headers", None), getattr(request, "request_dict", None),
                   getattr(request, "_request_dict", None), request):
        if source is not None:
            found = occurrence_of(source)
            if found is not None:
                break
    with contextlib.suppress(AttributeError, TypeError):
        setattr(request, _PARSED, (id(request), found))
    return found


def occurrence_or_none(request: Any) -> Occurrence | None:
    """The occurrence of ``request``, or ``None`` for one with malformed headers: only
    the start reports those (once), every later hook ignores them."""
    try:
        return from_request(request)
    except MalformedHeaders:
        return None
