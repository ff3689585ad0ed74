"""Request bodies of the job gateway: size-capped, strict JSON, errors that name the field."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticError

from celery_zsched.server.problems import Problem, bad_field, bad_fields

#: Largest request body: a report is a token, two times and an error text.
MAX_BODY = 4096
M = TypeVar("M", bound=BaseModel)


class _Strict(BaseModel):
    # Strict: "12" is not a number and true is not 1; unknown fields are refused.
    model_config = ConfigDict(extra="forbid", strict=True)


class HeartbeatReport(_Strict):
    """``POST /jobs/{id}/heartbeat``: the lease to extend."""

    lease: str = Field(min_length=1, max_length=100,
                       description="The lease token `GET /jobs/next` handed out, as is.")


#: The window an echoed time must fall in: 2000-01-01 to 2100-01-01, epoch ms. A
#: time in microseconds or seconds, or a huge number, is refused here (400 naming
#: it); one inside it but far from Redis' clock is dropped by the settle.
EPOCH_MS_MIN, EPOCH_MS_MAX = 946_684_800_000, 4_102_444_800_000


# Printable ASCII: a validator goes back out in an HTTP header.
_PRINTABLE = r"^[\x20-\x7e]+$"


class CompleteReport(HeartbeatReport):
    """``POST /jobs/{id}/complete``: the lease, and the times it was handed out with."""

    scheduled_at: int | None = Field(
        None, ge=EPOCH_MS_MIN, le=EPOCH_MS_MAX,
        description="Echo of the job's scheduled_at (epoch ms, Redis' clock).")
    picked_up_at: int | None = Field(
        None, ge=EPOCH_MS_MIN, le=EPOCH_MS_MAX,
        description="Echo of the job's picked_up_at (epoch ms, Redis' clock).")
    status: int | None = Field(None, ge=100, le=599,
                               description="HTTP status the target answered (feeds pacing; "
                                           "a 304 is a visit without change).")
    changed: bool | None = Field(
        None, description="Whether the page changed since the last visit (a 304: false). "
                          "Feeds change-aware recrawl.")
    signature: str | None = Field(
        None, min_length=1, max_length=128, pattern=_PRINTABLE,
        description="A hash of the content: one unlike the last visit's is a change.")
    etag: str | None = Field(None, min_length=1, max_length=512, pattern=_PRINTABLE,
                             description="The ETag answered, for the next If-None-Match.")
    last_modified: str | None = Field(
        None, min_length=1, max_length=64, pattern=_PRINTABLE,
        description="The Last-Modified answered, for the next If-Modified-Since.")


class ErrorReport(CompleteReport):
    """``POST /jobs/{id}/error``: what went wrong, and what the target answered."""

    error: str = Field(min_length=1, max_length=2000, description="What went wrong.")
    retry_after: float | None = Field(
        None, ge=0, le=86400 * 7,
        description="Seconds the target asked to wait (its Retry-After): the retry waits "
                    "this long, and with pacing on its domain does too.")


#: Most jobs one poll takes (``?max=``), and most reports one batch report carries.
MAX_BATCH = 100


class ReportItem(ErrorReport):
    """One report of a batch: a job id, its outcome, and that outcome's report fields
    (``error``, ``status`` and ``retry_after`` only with ``error``)."""

    id: str = Field(min_length=1, max_length=200, description="The job's id.")
    outcome: Literal["complete", "error"]
    error: str = Field("", max_length=2000, description="What went wrong (outcome error: "
                                                        "required).")


class BatchReport(_Strict):
    """``POST /jobs/report``: the reports, each as a single report would send it."""

    reports: list[ReportItem] = Field(min_length=1, max_length=MAX_BATCH)


async def read_body(request: Request, limit: int = MAX_BODY) -> bytes:
    """The request body; ``413`` as soon as it passes ``limit`` bytes (never read whole)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large(limit)
    return bytes(body)


def too_large(limit: int) -> Problem:
    """``413``: the body passed ``limit`` bytes (the server stops reading, and closes)."""
    return Problem(413, "body too large", f"this request's body is at most {limit} bytes")


def json_object(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object; ``400`` naming ``body`` otherwise."""
    try:
        data = json.loads(raw) if raw.strip() else None
    except (ValueError, RecursionError) as exc:
        raise bad_field("body", f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise bad_field("body", "must be a JSON object")
    return data


async def read_model(request: Request, model: type[M]) -> M:
    """The body parsed as ``model``; ``400`` naming the field (or ``body``) otherwise."""
    data = json_object(await read_body(request))
    try:
        return model.model_validate(data)
    except PydanticError as exc:
        raise pydantic_problem(exc) from None


def pydantic_problem(exc: PydanticError, prefix: tuple[str | int, ...] = ()) -> Problem:
    """``400`` naming every field pydantic refused (the first as ``field``)."""
    return bad_fields(pydantic_fields(exc.errors(), prefix))


def pydantic_fields(errors: Sequence[Any], prefix: tuple[str | int, ...] = (),
                    skip: tuple[str, ...] = ("body",)) -> list[tuple[str, str]]:
    """(field, message) of each of pydantic's ``errors``, the field dotted and without
    the ``skip`` parts of its location."""
    found: list[tuple[str, str]] = []
    for error in errors:
        loc = [str(part) for part in (*prefix, *error.get("loc", ())) if part not in skip]
        found.append((".".join(loc) or "body", str(error.get("msg", "invalid"))))
    return found or [("body", "invalid")]
