"""``POST /v1/jobs:import``: a bulk file of jobs, validated first, then stored staggered.

The body is the file itself: a JSON array, JSON Lines or CSV, exactly as
``zsched import`` reads it. Every row is validated before anything is written:
one bad row refuses the whole file (``400``, every bad row named by its job
number, line and field), so nothing is ever half-imported. New jobs' first runs
spread over each job's interval; jobs that exist are updated without moving
their schedules unless their timing changed.

Memory stays within a small multiple of the body whatever its size and shape: the
body is spooled to a temporary file as it arrives (hashed on the way, for the
Idempotency-Key), read back a chunk at a time, and each valid job spooled to another
temporary file as its stored JSON, which the write streams to the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from typing import IO, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from celery_zsched.core.audit import Actor
from celery_zsched.core.errors import ImportValidationError, ValidationError
from celery_zsched.core.formats import FORMATS, stream_rows
from celery_zsched.core.rows import parse_rows_spooled
from celery_zsched.server import idempotency
from celery_zsched.server.auth import require
from celery_zsched.server.bodies import too_large
from celery_zsched.server.jobs import actor_of, store_of, writer_of
from celery_zsched.server.problems import Problem, bad_field, invalid_job
from celery_zsched.server.views import ImportResult
from celery_zsched.services.writer import JobWriter
from celery_zsched.store import Store

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


#: Body bytes held in memory before the spool moves to a temporary file.
SPOOL_MEMORY = 1 << 20


def _rejected(errors: list[ValidationError], count: int) -> Problem:
    listed = [{"job": e.job, "line": e.row if e.line_shown else None, "ref": e.ref,
               "field": e.field, "message": e.message, "error": str(e)}
              for e in errors[:MAX_ERRORS_LISTED]]
    first = errors[0]
    return Problem(400, "invalid import",
                   f"{count} invalid job(s), nothing was written; first: {first}",
                   field=first.field, errors=listed, error_count=count)


async def spool_body(request: Request, limit: int) -> tuple[IO[bytes], bytes]:
    """The body in a temporary file (in memory up to :data:`SPOOL_MEMORY`), and its
    SHA-256; ``413`` as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY)  # noqa: SIM115 (returned)
    digest, size = hashlib.sha256(), 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            spool.write(chunk)
            digest.update(chunk)
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return spool, digest.digest()


def _import(store: Store, writer: JobWriter, body: IO[bytes], fmt: str, dry_run: bool,
            by: Actor) -> ImportResult:
    result = parse_rows_spooled(stream_rows(body, fmt, "body"), store.defaults,
                                errors_kept=MAX_ERRORS_LISTED)
    try:
        if result.errors:
            raise _rejected(result.errors, result.error_count)
        if dry_run:
            return ImportResult(total=result.count, created=0, updated=0, rescheduled=0,
                                dry_run=True, seconds=0.0)
        report = writer.import_jobs(result.jobs(), by, "bulk import (REST API)",
                                    total=result.count)
    finally:
        result.close()
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
    body, digest = await spool_body(request, MAX_IMPORT_BYTES)

    async def act() -> Response:
        try:
            result = await asyncio.to_thread(_import, store, writer_of(request), body, fmt,
                                             dry_run, actor_of(request))
        except ImportValidationError as exc:  # a writer's own check (Django's)
            raise _rejected(exc.errors, len(exc.errors)) from None
        except ValidationError as exc:  # the file as a whole (FileError), or the format
            raise invalid_job(exc) from None
        return JSONResponse(result.model_dump())
    try:
        # The body's digest stands for it: the retry of a 64 MiB import is not kept.
        return await idempotency.once(request, store, digest, act)
    finally:
        body.close()
