"""``GET /v1/jobs/{id}/executions``: a job's recent runs, from the settle stream.

Every settle appends to its partition's capped stream (``zsched_events_maxlen``
entries), which this reads backwards, newest first. A job that runs rarely among
many is found by scanning: one call scans at most :data:`SCAN_BUDGET` entries and,
if it has not found ``limit`` runs by then, answers what it found with a cursor
to scan on from. Runs older than the stream keeps are in the Django run history
(``ZSchedRun``) when the app is installed.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from celery_zsched.core import stream_ids
from celery_zsched.server.auth import require
from celery_zsched.server.problems import Problem, bad_field
from celery_zsched.server.views import Execution, ExecutionPage
from celery_zsched.store import Store
from celery_zsched.store.dead import iso
from celery_zsched.store.errors import redis_unavailable

router = APIRouter()
#: Stream entries one call reads at most, and per round trip.
SCAN_BUDGET, SCAN_PAGE = 20_000, 1000
_STREAM_ID = re.compile(r"^([0-9]{1,20})-([0-9]{1,20})\Z")  # not \d: any Unicode digit
#: A stream id is two unsigned 64-bit numbers.
_U64 = 2**64


def valid_cursor(before: str) -> bool:
    """``before`` is a stream id Redis can read before: two 64-bit parts, not ``0-0``
    (Redis refuses an exclusive bound below its smallest id, and no cursor is it)."""
    match = _STREAM_ID.match(before)
    if match is None:
        return False
    ms, seq = int(match[1]), int(match[2])
    return ms < _U64 and seq < _U64 and (ms, seq) != (0, 0)


def _execution(stream_id: str, fields: dict[str, str]) -> Execution:
    try:
        timings: Any = json.loads(fields.get("data") or "{}") or {}
    except ValueError:
        timings = {}
    return Execution(
        id=stream_id, at=iso(int(fields.get("at") or stream_ids.millis(stream_id))),
        occurrence=int(fields.get("occ") or 0), attempt=int(fields.get("attempt") or 1),
        status=fields.get("status", ""), error=fields.get("error") or None,
        timings=timings if isinstance(timings, dict) else {})


def scan(store: Store, job_id: str, limit: int, before: str | None
         ) -> tuple[list[Execution], str | None]:
    """Up to ``limit`` runs of ``job_id`` older than stream id ``before``, and the cursor
    to continue from (``None``: the stream has no older entries)."""
    key = store.part_of(job_id).events
    upper = f"({before}" if before else "+"
    found: list[Execution] = []
    scanned = 0
    with redis_unavailable():
        while True:
            rows = store.client.xrevrange(key, max=upper, min="-", count=SCAN_PAGE)
            for sid, raw in rows or []:
                fields = {str(k): str(v) for k, v in (raw or {}).items()}
                scanned += 1
                if fields.get("id") == job_id:
                    found.append(_execution(str(sid), fields))
                    if len(found) == limit:
                        return found, str(sid)
            if len(rows or []) < SCAN_PAGE:
                return found, None
            last = str(rows[-1][0])
            if scanned >= SCAN_BUDGET:
                return found, last
            upper = f"({last}"


@router.get("/jobs/{job_id:path}/executions", dependencies=[Depends(require("read"))],
            response_model=ExecutionPage, summary="A job's recent runs",
            responses={404: {"description": "No such job, and no runs of it"}})
async def list_executions(
    job_id: Annotated[str, Path(min_length=1, max_length=200)], request: Request,
    limit: int = Query(20, ge=1, le=200, description="Most runs on the page."),
    before: str | None = Query(None, max_length=45,
                               description="next_cursor of the page before."),
) -> JSONResponse:
    """Newest first: when, occurrence and attempt, outcome, error, and the timings (due,
    published, started, wait and lateness). A deleted job's runs are still listed."""
    store: Store = request.app.state.store
    if before is not None and not valid_cursor(before):
        raise bad_field("before", "must be a next_cursor this endpoint gave")
    items, cursor = await asyncio.to_thread(scan, store, job_id, limit, before)
    if not items and before is None and cursor is None:
        exists = await asyncio.to_thread(store.get_many, [job_id])
        if exists[0] is None:
            raise Problem(404, "not found", f"no job with id {job_id!r}, and no runs of it",
                          field="id")
    return JSONResponse(ExecutionPage(items=items, next_cursor=cursor).model_dump(mode="json"))
