"""Conditional fetches: the validators a task's message carries, as request headers.

Beat copies a job's last ``ETag``, ``Last-Modified`` and content signature
(kept by the store from the last visit's report) into the message headers
``zsched_etag``, ``zsched_last_modified`` and ``zsched_signature``.
:func:`validators` turns them into the ``If-None-Match`` / ``If-Modified-Since``
headers to send; a ``304`` answer is then reported as a visit without change
(``report("complete", status=304)``), a success for pacing and the breaker.
"""

from __future__ import annotations

from typing import Any

from celery import current_task

from celery_zsched.core.recrawl import MAX_VALIDATOR, Visit, validator_problem

#: Message header of each validator, and the request header it becomes.
HEADERS = {"etag": "zsched_etag", "last_modified": "zsched_last_modified",
           "signature": "zsched_signature"}
_CONDITIONAL = {"etag": "If-None-Match", "last_modified": "If-Modified-Since"}


def stored_validators(request: Any = None) -> dict[str, str]:
    """The validators the message of ``request`` (default: the running task's) carries,
    by name (``etag``, ``last_modified``, ``signature``); a value that is not a valid
    one (a forged or stray message) is left out."""
    request = current_task.request if request is None else request
    found: dict[str, str] = {}
    for name, header in HEADERS.items():
        value = _header(request, header)
        if value is not None and validator_problem(value, MAX_VALIDATOR[name]) is None:
            found[name] = value
    return found


def validators(request: Any = None) -> dict[str, str]:
    """The conditional request headers to send for the running task's page.

    For example ``httpx.get(url, headers=validators())`` sends
    ``If-None-Match`` and ``If-Modified-Since`` when the last visit reported an
    ETag and a Last-Modified; an empty dict before the first one.
    """
    stored = stored_validators(request)
    return {_CONDITIONAL[name]: value for name, value in stored.items() if name in _CONDITIONAL}


def visit_of(exception: BaseException | None, status: int | None) -> Visit | None:
    """What a failed task's ``JobFailed`` reported of its page (``None``: nothing, or
    nothing valid: an error must still settle)."""
    fields = {name: getattr(exception, name, None)
              for name in ("changed", "signature", "etag", "last_modified")}
    if status == 304 and fields["changed"] is None:
        fields["changed"] = False
    try:
        visit = Visit(**fields)
    except ValueError:
        return None
    return visit if visit.reported else None


def _header(request: Any, name: str) -> Any:
    for source in (getattr(request, "headers", None), request):
        if isinstance(source, dict):
            if name in source:
                return source[name]
        elif source is not None and getattr(source, name, None) is not None:
            return getattr(source, name)
    return None
