"""The job gateway: the worker protocol for workers in any language.

``GET /jobs/next`` long-polls for one due HTTP job (``?max=N``: up to N, each
under a lease of its own); ``POST /jobs/{id}/complete`` and ``POST /jobs/{id}/error``
settle it (compare-and-set on the lease token), ``POST /jobs/report`` (in
:mod:`.gateway_batch`) settles many; ``POST /jobs/{id}/heartbeat`` extends its
lease. Every route needs a token of scope ``worker``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from celery_zsched.core.recrawl import Visit
from celery_zsched.core.results import Claimed, SettleReport, SettleResult
from celery_zsched.core.telemetry import log_event
from celery_zsched.server.auth import require
from celery_zsched.server.bodies import (
    MAX_BATCH,
    CompleteReport,
    ErrorReport,
    HeartbeatReport,
    read_model,
)
from celery_zsched.server.dispatcher import Dispatcher, ShuttingDown, StoreDown
from celery_zsched.server.gateway_views import (
    Extended,
    JobBatch,
    JobOffer,
    NotExtended,
    NotSettled,
    Settled,
)
from celery_zsched.server.jobs import JobId
from celery_zsched.server.lease import Lease, LeaseSigner
from celery_zsched.server.problems import Problem, bad_field
from celery_zsched.services import signals, tracing
from celery_zsched.services.robots import RobotsGuard
from celery_zsched.store import Store

logger = logging.getLogger("celery_zsched.server")
router = APIRouter(tags=["gateway"], dependencies=[Depends(require("worker"))])
#: Retry-After of a 503 while the server shuts down (another one will answer).
SHUTDOWN_RETRY_S = 5
#: Retry-After of a 503 when as many long-polls wait as the server takes.
POLLS_RETRY_S = 1


@dataclass
class Gateway:
    """What the gateway's routes share: the store, the dispatcher, the lease signer."""

    store: Store
    dispatcher: Dispatcher
    signer: LeaseSigner
    timeout_s: float
    lease_s: float
    #: Sends the signals of each settle (the Celery app, as a worker does).
    sender: Any = None
    #: Most long-polls waiting at once (``zsched_gateway_max_polls``); past it ``503``.
    max_polls: int = 1 << 30
    #: The robots.txt check before a hand-out (``zsched_robots``), made on first use.
    robots: RobotsGuard | None = None

    async def permitted(self, claimed: list[Claimed]) -> list[Claimed]:
        """Those of ``claimed`` that may be handed out (see :meth:`permit`)."""
        return [one for one in claimed if await self.permit(one)]

    async def permit(self, claimed: Claimed) -> bool:
        """Whether ``claimed`` may be handed out: with ``zsched_robots`` on, a job whose
        URL robots.txt disallows is settled ``blocked_by_robots`` here instead, so
        HTTP workers never see it (their poll answers ``204``: poll again)."""
        job, settings = claimed.job, self.store.settings
        if not settings.robots or not job.url:
            return True
        if self.robots is None:
            self.robots = RobotsGuard(self.store)
        # A fetch of robots.txt may take its timeout: off the event loop.
        verdict = await asyncio.to_thread(self.robots.check, job.url,
                                          job.pacing_domain(settings))
        if verdict.allowed:
            return True
        wait = verdict.retry_s if verdict.retry_s is not None else getattr(
            job, "max_interval_s", None)
        result = await asyncio.to_thread(
            self.store.settle, job.id, claimed.occurrence, claimed.attempt, "blocked",
            error=f"robots.txt: {verdict.reason} {job.url}", retry_after_s=wait,
            event={"task_id": None, "transport": "http", "due_ms": claimed.due_ms,
                   "promoted_ms": claimed.promoted_ms},
            fence=claimed.fence)
        log_event("job_blocked_by_robots", logging.WARNING, job_id=job.id,
                  occurrence=claimed.occurrence, url=job.url, reason=verdict.reason,
                  retry_s=wait, applied=result.applied, next_run_at=result.next_due_ms)
        return False

    def job_body(self, claimed: Claimed) -> dict[str, Any]:
        """What a worker gets: the job, and the lease it echoes back."""
        job = claimed.job
        lease = Lease(job.id, claimed.occurrence, claimed.attempt, claimed.fence)
        return JobOffer(
            id=job.id, url=job.url, interval_s=job.interval_s, cron=job.cron,
            timezone=job.timezone, meta=job.meta, queue=job.queue, task=job.task,
            args=job.args, kwargs=job.kwargs,
            occurrence=claimed.occurrence, attempt=claimed.attempt,
            deliveries=claimed.deliveries,
            lease=self.signer.token(lease), lease_s=self.lease_s,
            scheduled_at=claimed.due_ms, picked_up_at=claimed.promoted_ms,
            traceparent=_traced(claimed),
            **claimed.validators,
        ).model_dump(mode="json")

    def offer(self, claimed: list[Claimed], most: int | None) -> Response:
        """The answer of a poll: ``204`` with no job; the job itself to a poll without
        ``max`` (the protocol's first shape, kept); ``{"jobs": [...]}`` to one with it."""
        if not claimed:
            return Response(status_code=204)
        if most is None:
            return JSONResponse(self.job_body(claimed[0]))
        return JSONResponse({"jobs": [self.job_body(c) for c in claimed]})

    def lease_of(self, job_id: str, token: str) -> Lease:
        """The lease a report holds on ``job_id``; ``400`` if the token is not one.

        A token of another job, an unknown job and a made-up token get the same
        answer, which names no job.
        """
        lease = self.signer.read(job_id, token)
        if lease is None:
            raise bad_field("lease", "not a lease token this server handed out for this job")
        return lease


def _traced(claimed: Claimed) -> str | None:
    """The hand-out's span (``zsched_tracing``): its ``traceparent``, or ``None``."""
    tracer = tracing.active()
    if tracer is None:
        return None
    try:
        return tracer.handed_out(claimed)
    except Exception:  # tracing must never fail a hand-out
        logger.exception("zsched gateway: tracing the hand-out of %s failed", claimed.job.id)
        return None


def _trace_report(headers: Mapping[str, str], report: SettleReport,
                  result: SettleResult) -> None:
    tracer = tracing.active()
    if tracer is None:
        return
    try:
        tracer.reported(report.job_id, report.occurrence, report.attempt, report.fence or 0,
                        report.outcome, result, headers)
    except Exception:  # the settle is done: tracing must never fail the report
        logger.exception("zsched gateway: tracing the report of %s failed", report.job_id)


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def _unavailable(exc: ShuttingDown | StoreDown) -> Problem:
    if isinstance(exc, ShuttingDown):
        return Problem(503, "shutting down", "this server is shutting down; poll another",
                       headers={"Retry-After": str(SHUTDOWN_RETRY_S)})
    return Problem(503, "store unavailable", str(exc),
                   headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))})


async def _disconnected(request: Request) -> None:
    """Returns when the client hangs up (the ASGI ``http.disconnect`` message)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


@router.get(
    "/jobs/next",
    summary="Long-poll for due jobs",
    responses={200: {"description": "A job, with the lease to echo back; with max, "
                                    "{\"jobs\": [...]}: 1 to max jobs, each with its own lease",
                     "model": JobOffer | JobBatch},
               204: {"description": "No job fell due before the timeout"},
               503: {"description": "Shutting down, or Redis is unreachable (see Retry-After)"}})
async def next_job(
    request: Request,
    queue: str = Query("", max_length=200,
                       description="Only jobs whose queue field is this (default: any)."),
    timeout: float | None = Query(None, ge=0, description="Seconds to wait at most "
                                  "(default and cap: zsched_gateway_timeout_s)."),
    most: int | None = Query(None, alias="max", ge=1, le=MAX_BATCH, description=(
        f"Take up to this many jobs (1 to {MAX_BATCH}) in one answer, {{\"jobs\": [...]}}, "
        "as soon as one is due. Without it: one job, the job itself.")),
) -> Response:
    """Claim due jobs (atomically, like beat), or wait for one to fall due."""
    gateway = _gateway(request)
    dispatcher = gateway.dispatcher
    wait = gateway.timeout_s if timeout is None else min(timeout, gateway.timeout_s)
    if wait <= 0:
        taken = await _take_now(gateway, queue, most or 1)
        return gateway.offer(await gateway.permitted(taken), most)
    if dispatcher.polls >= gateway.max_polls:
        # Long-polls hold their connections: bounded apart, they never crowd out
        # the connections of reports and the management API.
        raise Problem(503, "too many polls", f"{dispatcher.polls} long-polls are waiting, as "
                      "many as this server takes; retry, or poll another server",
                      headers={"Retry-After": str(POLLS_RETRY_S)})
    try:
        waiter = dispatcher.enter(queue, most or 1)
    except (ShuttingDown, StoreDown) as exc:
        raise _unavailable(exc) from None
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        pending: set[asyncio.Future[Any]] = {waiter.future, gone}
        await asyncio.wait(pending, timeout=wait,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        hung_up = gone.done()
        gone.cancel()
    try:
        claimed = dispatcher.withdraw(waiter)
    except (ShuttingDown, StoreDown) as exc:
        raise _unavailable(exc) from None
    if claimed and hung_up:
        dispatcher.give_back(claimed)  # nobody is listening: back to the schedule
        return Response(status_code=204)
    return gateway.offer(await gateway.permitted(claimed), most)


async def _take_now(gateway: Gateway, queue: str, most: int) -> list[Claimed]:
    """``timeout=0``: the jobs due now, or none at once (one claim, no waiting in line)."""
    if gateway.dispatcher.closing:
        raise _unavailable(ShuttingDown())
    batch = await asyncio.to_thread(gateway.store.claim_http, most, queue)
    return list(batch.jobs)


def answer(result: SettleResult) -> tuple[int, dict[str, Any]]:
    """The status and body that tell a worker what its report did."""
    if result.applied:
        return 200, Settled(applied=True, outcome=result.label, status=result.status,
                            next_run_at=result.next_due_ms).model_dump()
    return 409, NotSettled(
        applied=False, reason=result.status,
        detail="nothing changed: this lease was already reported, or its job was "
               "reaped, rescheduled, edited or deleted meanwhile").model_dump()


def _visit(report: CompleteReport) -> Visit | None:
    changed = False if report.status == 304 and report.changed is None else report.changed
    # The body's schema already bounds each value as Visit does.
    visit = Visit(changed, report.signature, report.etag, report.last_modified)
    return visit if visit.reported else None


def settle_report(lease: Lease, report: CompleteReport, outcome: str) -> SettleReport:
    """What the store settles for ``report`` on ``lease``: the outcome, fenced, with the
    run's timings (the echoed times, both on Redis' clock) and what the fetch saw."""
    due, picked = report.scheduled_at, report.picked_up_at
    timings = {"task_id": None, "transport": "http", "due_ms": due, "promoted_ms": picked,
               "started_ms": picked, "wait_ms": 0 if picked is not None else None,
               "lateness_ms": picked - due if due is not None and picked is not None else None}
    if isinstance(report, ErrorReport):
        return SettleReport(lease.job_id, lease.occurrence, lease.attempt, outcome,
                            error=report.error, retry_after_s=report.retry_after,
                            event=timings, http_status=report.status, fence=lease.fence,
                            visit=_visit(report))
    return SettleReport(lease.job_id, lease.occurrence, lease.attempt, outcome, event=timings,
                        http_status=report.status, fence=lease.fence, visit=_visit(report))


def after_settle(gateway: Gateway, report: SettleReport, result: SettleResult,
                 headers: Mapping[str, str]) -> None:
    """Log the settle's event, as a Celery worker does, trace it (``headers``: the
    request's, which may carry a trace context), and send its signals."""
    assert report.event is not None
    picked, outcome = report.event["promoted_ms"], report.outcome
    # Start and end are both on Redis' clock: the claim's and the settle's.
    duration = (result.now_ms - picked if result.now_ms is not None and picked is not None
                else None)
    log_event("job_complete" if outcome == "complete" else "job_error",
              logging.INFO if outcome == "complete" else logging.WARNING,
              job_id=report.job_id, occurrence=report.occurrence, attempt=report.attempt,
              status=result.label, applied=result.applied, error=report.error or None,
              http_status=report.http_status, lateness_ms=report.event["lateness_ms"],
              wait_ms=report.event["wait_ms"], duration_ms=duration,
              next_run_at=result.next_due_ms)
    _trace_report(headers, report, result)
    try:
        signals.after_settle(gateway.sender, report.job_id, report.occurrence, report.attempt,
                             outcome, report.error, result,
                             gateway.store.settings.notify_streak)
    except Exception:  # the settle is done: a signal must never fail the report
        logger.exception("zsched gateway: signalling the settle of %s failed", report.job_id)


async def _settle(request: Request, job_id: str, report: CompleteReport,
                  outcome: str) -> JSONResponse:
    gateway = _gateway(request)
    lease = gateway.lease_of(job_id, report.lease)
    settle = settle_report(lease, report, outcome)
    result = (await asyncio.to_thread(gateway.store.settle_many, [settle]))[0]
    after_settle(gateway, settle, result, request.headers)
    status, body = answer(result)
    return JSONResponse(body, status_code=status)


_NOT_SETTLED: dict[int | str, dict[str, Any]] = {
    409: {"description": "Stale or repeated report: nothing changed", "model": NotSettled}}


@router.post("/jobs/{job_id:path}/complete", summary="Report a job done",
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": CompleteReport.model_json_schema()}}}},
             response_model=Settled, responses=_NOT_SETTLED)
async def complete(job_id: JobId, request: Request) -> JSONResponse:
    """Settle (compare-and-set): the job's next run is scheduled from now."""
    report = await read_model(request, CompleteReport)
    return await _settle(request, job_id, report, "complete")


@router.post("/jobs/{job_id:path}/error", summary="Report a job failed",
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": ErrorReport.model_json_schema()}}}},
             response_model=Settled, responses=_NOT_SETTLED)
async def error(job_id: JobId, request: Request) -> JSONResponse:
    """Settle (compare-and-set): a retry with backoff, or the next regular run."""
    report = await read_model(request, ErrorReport)
    return await _settle(request, job_id, report, "error")


@router.post("/jobs/{job_id:path}/heartbeat", summary="Extend a job's lease",
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": HeartbeatReport.model_json_schema()}}}},
             response_model=Extended,
             responses={409: {"description": "The lease is no longer held: nothing changed",
                              "model": NotExtended}})
async def heartbeat(job_id: JobId, request: Request) -> JSONResponse:
    """The lease runs zsched_gateway_lease_s from now again, while the job is still running."""
    gateway = _gateway(request)
    report = await read_model(request, HeartbeatReport)
    lease = gateway.lease_of(job_id, report.lease)
    gone = await asyncio.to_thread(
        gateway.store.heartbeat, [(lease.job_id, lease.occurrence, lease.attempt, lease.fence)],
        lease_s=gateway.lease_s)
    if gone:
        return JSONResponse(NotExtended(extended=False, detail="this lease is no longer held: "
                                        "it was reported, or it ended and the job went back")
                            .model_dump(), status_code=409)
    return JSONResponse(Extended(extended=True, lease_s=gateway.lease_s).model_dump())
