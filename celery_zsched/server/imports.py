"""``POST /v1/jobs:import``: a bulk file of jobs, validated first, then stored staggered.

The body is the file itself: a JSON array, JSON Lines or CSV, exactly as
``zsched import`` reads it. Every row is validated before anything is written:
one bad row refuses the whole file (``400``, every bad row named by its job
number, line and field), so nothing is ever half-imported. New jobs' first runs
spread over each job's interval; jobs that exist are updated without moving
their schedules unless their timing changed.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from ..audit import Actor
from ..errors import ImportValidationError, ValidationError
from ..importer import FORMATS, decode_text, parse_rows, text_rows
from ..store import Store
from . import idempotency
from .auth import require
from .bodies import read_body
from .jobs import actor_of, store_of, writer_of
from .problems import Problem, bad_field, invalid_job
from .views import ImportResult
from .writer import JobWriter

router = APIRouter(prefix="/v1", tags=["jobs"])
#: Largest import body (about 300,000 typical rows); split larger files.
MAX_IMPORT_BYTES = 64 * 1024 * 1024
#: Bad rows an answer lists (it counts them all).
MAX_ERRORS_LISTED = 100
_MEDIA = {"application/json": "json", "application/x-ndjson": "jsonl",
          "application/jsonl": "jsonl", "application/x-jsonlines": "jsonl",
          "text/csv": "csv"}


def _format(request: Request, given: str | None) -> str:
    if given is not None:
        return given
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media not in _MEDIA:
        raise bad_field("format", f"give ?format= ({', '.join(FORMATS)}) or a Content-Type "
                                  f"of {', '.join(_MEDIA)}")
    return _MEDIA[media]


def _rejected(exc: ImportValidationError) -> Problem:
    errors = [{"job": e.job, "line": e.row if e.line_shown else None, "ref": e.ref,
               "field": e.field, "message": e.message, "error": str(e)}
              for e in exc.errors[:MAX_ERRORS_LISTED]]
    first = exc.errors[0]
    return Problem(400, "invalid import",
                   f"{len(exc.errors)} invalid job(s), nothing was written; first: {first}",
                   field=first.field, errors=errors, error_count=len(exc.errors))


def _import(store: Store, writer: JobWriter, raw: bytes, fmt: str, dry_run: bool,
            by: Actor) -> ImportResult:
    result = parse_rows(text_rows(decode_text(raw, "body"), fmt), store.defaults)
    if dry_run:
        return ImportResult(total=len(result.jobs), created=0, updated=0, rescheduled=0,
                            dry_run=True, seconds=0.0)
    report = writer.import_jobs(result.jobs, by, "bulk import (REST API)")
    return ImportResult(total=report.total, created=report.created, updated=report.updated,
                        rescheduled=report.rescheduled, dry_run=False,
                        seconds=round(report.seconds, 3))


@router.post(
    "/jobs:import", dependencies=[Depends(require("write"))], response_model=ImportResult,
    summary="Import a file of jobs",
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"type": "array", "items": {"type": "object"}}},
        "application/x-ndjson": {"schema": {"type": "string"}},
        "text/csv": {"schema": {"type": "string"}}}}, **idempotency.OPENAPI_HEADER},
    responses={413: {"description": "Over the size limit"}, **idempotency.RESPONSES})
async def import_jobs(
    request: Request,
    format: Literal["json", "jsonl", "csv"] | None = Query(
        None, description="The body's format (default: from its Content-Type)."),
    dry_run: bool = Query(False, description="Validate only; write nothing."),
) -> Response:
    """Validate every row, then store them all (or, with one bad row, none). Takes an
    ``Idempotency-Key``: a retried import is not run twice."""
    fmt = _format(request, format)
    store = store_of(request)
    raw = await read_body(request, MAX_IMPORT_BYTES)

    async def act() -> Response:
        try:
            result = await asyncio.to_thread(_import, store, writer_of(request), raw, fmt,
                                             dry_run, actor_of(request))
        except ImportValidationError as exc:
            raise _rejected(exc) from None
        except ValidationError as exc:  # the file as a whole (FileError), or the format
            raise invalid_job(exc) from None
        return JSONResponse(result.model_dump())
    return await idempotency.once(request, store, raw, act)
