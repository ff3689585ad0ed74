"""The management API: ``/v1/jobs``, create, list, read, edit, delete and run jobs.

Every change goes through the same store calls as the CLI and the admin (the
same Lua scripts, the same audit trail, recorded as made by ``api`` and the
token's fingerprint). Reads need a ``read`` (or ``write``) token; changes a
``write`` token. Errors are problem+json naming the field at fault; an error
about a job names only the id the request gave.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import JSONResponse

from celery_zsched.core.audit import Actor
from celery_zsched.core.errors import JobNotFound, ValidationError
from celery_zsched.core.job import Defaults, Job
from celery_zsched.core.results import JobInfo
from celery_zsched.server import executions, idempotency
from celery_zsched.server.auth import require, token_fingerprint
from celery_zsched.server.bodies import json_object, read_body
from celery_zsched.server.job_input import (
    MAX_JOB_BODY,
    JobFields,
    JobPatch,
    edited_job,
    new_job,
    request_body,
    status_of,
)
from celery_zsched.server.problems import Problem, bad_field, invalid_job
from celery_zsched.server.views import JobPage, JobView, RunResult, job_view
from celery_zsched.services.writer import JobWriter
from celery_zsched.store import Store

router = APIRouter(prefix="/v1", tags=["jobs"])
READ = [Depends(require("read"))]
WRITE = [Depends(require("write"))]
#: How many compare-and-set rounds an edit without If-Match tries before it gives up.
EDIT_ROUNDS = 5
#: Most fires a job's page shows.
MAX_FIRES = 100

JobId = Annotated[str, Path(description="The job's id (a / in it is sent as %2F).",
                            min_length=1, max_length=200)]


def store_of(request: Request) -> Store:
    """The app's store."""
    store: Store = request.app.state.store
    return store


def writer_of(request: Request) -> JobWriter:
    """Where the app's changes to definitions go (the store, or Django's models)."""
    writer: JobWriter = request.app.state.writer
    return writer


def actor_of(request: Request) -> Actor:
    """Who the audit trail says made a change: ``api`` and the token's fingerprint."""
    return Actor("api", f"token {token_fingerprint(request)}")


def not_found(job_id: str) -> Problem:
    """``404`` for ``job_id``, the id the request gave (nothing of any other job)."""
    return Problem(404, "not found", f"no job with id {job_id!r}", field="id")


async def read_job(store: Store, job_id: str) -> tuple[JobInfo, bool]:
    """The job and whether it comes from beat_schedule; ``404`` if there is none."""
    def read() -> tuple[JobInfo | None, bool]:
        return store.get_many([job_id])[0], _static_flags(store, [job_id])[0]

    info, static = await asyncio.to_thread(read)
    if info is None:
        raise not_found(job_id)
    return info, static


async def view(store: Store, job_id: str, *, fires: int = 0) -> JobView:
    """The current view of ``job_id`` (re-read after a change)."""
    info, static = await read_job(store, job_id)
    now = await asyncio.to_thread(store.now_ms)
    return job_view(store, info, static=static, fires=fires, now_ms=now)


async def _write(change: Callable[..., bool], *args: Any) -> bool:
    """A writer's change, in a thread; a definition the writer refuses is ``400``.

    Django's model fields are stricter than the core in places (lengths).
    """
    try:
        return await asyncio.to_thread(change, *args)
    except ValidationError as exc:
        raise invalid_job(exc) from None


def _stale_etag() -> Problem:
    return Problem(412, "precondition failed",
                   "the definition changed since that ETag; read it again", field="If-Match")


def _answer(job: JobView, status: int = 200, **headers: str) -> JSONResponse:
    return JSONResponse(job.model_dump(mode="json"), status_code=status,
                        headers={"ETag": f'"{job.etag}"', **headers})


# Routes with a fixed tail come first: a job id may contain ":" and "/".
router.include_router(executions.router)


@router.post("/jobs/{job_id:path}:run", dependencies=WRITE, status_code=202,
             response_model=RunResult, summary="Run a job now",
             openapi_extra=idempotency.OPENAPI_HEADER,
             responses={404: {"description": "No such job"}, **idempotency.RESPONSES})
async def run_job(job_id: JobId, request: Request) -> Response:
    """Make the job due now (its domain's pacing still applies). A job in flight is left
    alone: ``ran`` is false. Takes an ``Idempotency-Key``."""
    store = store_of(request)

    async def act() -> Response:
        await read_job(store, job_id)
        try:
            ran = await asyncio.to_thread(store.run_now, job_id, by=actor_of(request))
        except JobNotFound:
            raise not_found(job_id) from None
        detail = "due now" if ran else "in flight: left alone; it runs on its schedule"
        return JSONResponse(RunResult(id=job_id, ran=bool(ran), detail=detail).model_dump(),
                            status_code=202)
    return await idempotency.once(request, store, b"", act)


@router.post("/jobs", dependencies=WRITE, status_code=201, response_model=JobView,
             summary="Create a job",
             openapi_extra={**request_body(JobFields), **idempotency.OPENAPI_HEADER},
             responses={**idempotency.RESPONSES,
                        409: {"description": "A job with this id exists, or a request with "
                                             "this Idempotency-Key is still running"}})
async def create_job(request: Request) -> Response:
    """Create a job; it first runs now (cron: its next slot), with jitter. A job of the
    same id must not exist (``409``): edit it with PATCH. Takes an ``Idempotency-Key``:
    a retried POST gets the first answer and creates nothing twice."""
    store = store_of(request)
    body = await read_body(request, MAX_JOB_BODY)

    async def act() -> Response:
        # Parsing and validating (croniter, IDNA) is CPU work: off the event loop.
        job = await asyncio.to_thread(_parsed_new, body, store.defaults)
        if not await _write(writer_of(request).create, job, actor_of(request)):
            raise Problem(409, "conflict", f"a job with id {job.id!r} exists; PATCH it",
                          field="id")
        created = await view(store, job.id)
        return _answer(created, 201, Location=job_path(job.id))
    return await idempotency.once(request, store, body, act)


def _parsed_new(body: bytes, defaults: Defaults) -> Job:
    return new_job(json_object(body), defaults)


def job_path(job_id: str) -> str:
    """The path of ``job_id``'s resource, the id percent-encoded (``/`` as ``%2F``), so
    no client or proxy that rewrites paths can make it name another job."""
    return "/v1/jobs/" + quote(job_id, safe=":@")


@router.get("/jobs", dependencies=READ, response_model=JobPage, summary="List jobs")
async def list_jobs(
    request: Request,
    status: Literal["scheduled", "queued", "running", "paused", "dead", "finished"] | None
    = Query(None, description="Only jobs in this state."),
    kind: Literal["interval", "cron", "once"] | None = Query(None),
    queue: str | None = Query(None, max_length=200,
                              description="Only jobs of this queue (empty: no queue set)."),
    domain: str | None = Query(None, max_length=253,
                               description="Only jobs paced under this domain."),
    transport: Literal["celery", "http"] | None = Query(None),
    limit: int = Query(50, ge=1, le=1000, description="Most jobs on the page."),
    cursor: str | None = Query(None, max_length=2000,
                               description="next_cursor of the page before."),
) -> Response:
    """Walk the jobs, a page at a time, in no particular order (see ``next_cursor``)."""
    from celery_zsched.store.listing import JobFilter, list_page

    store = store_of(request)
    try:
        flt = JobFilter(status=status, kind=kind, queue=queue, domain=domain,
                        transport=transport)
        page = await asyncio.to_thread(list_page, store, flt, limit=limit, cursor=cursor)
    except ValidationError as exc:
        raise bad_field(exc.field, exc.message) from None
    static = await asyncio.to_thread(_static_flags, store, [i.job.id for i in page.items])
    now = await asyncio.to_thread(store.now_ms)
    items = [job_view(store, info, static=flag, now_ms=now)
             for info, flag in zip(page.items, static, strict=True)]
    return JSONResponse(JobPage(items=items, next_cursor=page.next_cursor)
                        .model_dump(mode="json"))


def _static_flags(store: Store, ids: list[str]) -> list[bool]:
    flags = store.per_job(ids, lambda pipe, keys, members: pipe.smismember(keys.static, members))
    return [bool(flag) for flag in flags]


@router.get("/jobs/{job_id:path}", dependencies=READ, response_model=JobView,
            summary="Read a job", responses={404: {"description": "No such job"}})
async def get_job(job_id: JobId, request: Request,
                  fires: int = Query(5, ge=0, le=MAX_FIRES,
                                     description="How many next fires to list.")) -> Response:
    """The definition, the live state, and the next fires (DST shifts and folds noted)."""
    return _answer(await view(store_of(request), job_id, fires=fires))


@router.patch("/jobs/{job_id:path}", dependencies=WRITE, response_model=JobView,
              summary="Edit a job", openapi_extra=request_body(JobPatch),
              responses={404: {"description": "No such job"},
                         409: {"description": "It comes from beat_schedule"},
                         412: {"description": "If-Match does not match the definition"}})
async def edit_job(job_id: JobId, request: Request) -> Response:
    """Replace the fields given; ``status`` pauses or resumes. A timing change moves the
    schedule (never earlier than the interval after the last run). With ``If-Match``
    (the ETag of a read), the edit applies only to that definition, else ``412``;
    without it, the fields given are merged into whatever is stored at the time."""
    store = store_of(request)
    patch = await asyncio.to_thread(json_object, await read_body(request, MAX_JOB_BODY))
    status = status_of(patch)
    if_match = request.headers.get("if-match")
    fields = {k: v for k, v in patch.items() if k != "status"}
    by = actor_of(request)
    for _ in range(EDIT_ROUNDS if fields else 1):
        info, static = await read_job(store, job_id)
        if if_match is not None and if_match.strip().strip('"') != info.tag:
            raise _stale_etag()
        if not fields:
            break
        if static:
            raise Problem(409, "conflict", "this job comes from beat_schedule: edit it there "
                                           "(only status may change here)", field="id")
        job = await asyncio.to_thread(edited_job, info.job, fields, store.defaults)
        if await _write(writer_of(request).replace, job, info.tag, by):
            break
        if if_match is not None:
            raise _stale_etag()
    else:
        raise Problem(409, "conflict", "the job kept changing under this edit; send it again",
                      headers={"Retry-After": "1"})
    if status is not None and not await asyncio.to_thread(
            writer_of(request).set_paused, job_id, status == "paused", by):
        raise not_found(job_id)
    return _answer(await view(store, job_id))


@router.delete("/jobs/{job_id:path}", dependencies=WRITE, status_code=204,
               summary="Delete a job", responses={404: {"description": "No such job"},
                                                  409: {"description": "From beat_schedule"}})
async def delete_job(job_id: JobId, request: Request) -> Response:
    """Delete it; a run in flight settles without bringing it back."""
    store = store_of(request)
    _, static = await read_job(store, job_id)
    if static:
        raise Problem(409, "conflict", "this job comes from beat_schedule: remove it there",
                      field="id")
    if not await asyncio.to_thread(writer_of(request).delete, job_id, actor_of(request)):
        raise not_found(job_id)
    return Response(status_code=204)

