"""``POST /jobs/report``: many reports in one request, each with its own lease and answer.

A worker that took a batch (``GET /jobs/next?max=N``) reports it back the same way.
Each report is settled exactly as ``POST /jobs/{id}/complete`` or ``/error`` would
settle it alone (compare-and-set on its lease), and gets the answer that route
would give, its status as ``code``: 200 applied, 409 stale or repeated, 400
malformed or not a lease of this job. One bad report changes nothing and does not
stop the others. All of them cost two Redis round trips
(:meth:`~celery_zsched.store.Store.settle_many`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError as PydanticError

from celery_zsched.core.results import SettleReport
from celery_zsched.server.auth import require
from celery_zsched.server.bodies import (
    MAX_BATCH,
    MAX_BODY,
    BatchReport,
    CompleteReport,
    ErrorReport,
    json_object,
    pydantic_fields,
    read_body,
)
from celery_zsched.server.gateway import _gateway, after_settle, answer, settle_report
from celery_zsched.server.gateway_views import ReportResults
from celery_zsched.server.problems import bad_field

router = APIRouter(tags=["gateway"], dependencies=[Depends(require("worker"))])
#: Largest batch report body: as many single reports at their largest.
MAX_BATCH_BODY = MAX_BATCH * MAX_BODY
_MODELS: dict[str, type[CompleteReport]] = {"complete": CompleteReport, "error": ErrorReport}


def _body_schema() -> dict[str, Any]:
    # Inlined: a "$defs" reference inside a request body would resolve against the
    # OpenAPI document's root, where there is none.
    schema = BatchReport.model_json_schema()
    schema["properties"]["reports"]["items"] = schema.pop("$defs")["ReportItem"]
    return schema


def _invalid(row: int, job_id: str | None, found: list[tuple[str, str]]) -> dict[str, Any]:
    fields = [(".".join(("reports", str(row), *([name] if name else []))), message)
              for name, message in found]
    problem = bad_field(*fields[0])
    return {"id": job_id, "code": 400, "title": problem.title, "detail": problem.detail,
            "field": fields[0][0],
            "errors": [{"field": f, "message": m} for f, m in fields]}


def _parse(row: int, item: Any) -> tuple[str, CompleteReport, str] | dict[str, Any]:
    """A report's (id, report, outcome), or its ``400`` answer."""
    if not isinstance(item, dict):
        return _invalid(row, None, [("", "must be a JSON object")])
    fields = dict(item)
    job_id, outcome = fields.pop("id", None), fields.pop("outcome", None)
    if not isinstance(job_id, str) or not 1 <= len(job_id) <= 200:
        return _invalid(row, None, [("id", "must be a job id: a string of 1 to 200 "
                                           "characters")])
    model = _MODELS.get(outcome) if isinstance(outcome, str) else None
    if model is None:
        return _invalid(row, job_id, [("outcome", "must be complete or error")])
    try:
        return job_id, model.model_validate(fields), outcome
    except PydanticError as exc:
        return _invalid(row, job_id, pydantic_fields(exc.errors()))


@router.post("/jobs/report", summary="Report many jobs done or failed",
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": _body_schema()}}}},
             response_model=ReportResults)
async def report(request: Request) -> JSONResponse:
    """Settle each report (compare-and-set) as its single route would: one answer per
    report, in order, each with the status that route would answer as ``code``."""
    gateway = _gateway(request)
    body = json_object(await read_body(request, MAX_BATCH_BODY))
    if set(body) != {"reports"}:
        extra = sorted(set(body) - {"reports"})
        raise bad_field(extra[0] if extra else "reports",
                        "unknown field" if extra else "required")
    items = body["reports"]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        raise bad_field("reports", f"must be an array of 1 to {MAX_BATCH} reports")
    results: list[dict[str, Any]] = []
    settles: list[tuple[int, SettleReport]] = []
    for row, item in enumerate(items):
        parsed = _parse(row, item)
        if isinstance(parsed, dict):
            results.append(parsed)
            continue
        job_id, one, outcome = parsed
        lease = gateway.signer.read(job_id, one.lease)
        if lease is None:
            results.append(_invalid(row, job_id, [(
                "lease", "not a lease token this server handed out for this job")]))
            continue
        settles.append((row, settle_report(lease, one, outcome)))
        results.append({})
    if settles:
        done = await asyncio.to_thread(gateway.store.settle_many, [s for _, s in settles])
        for (row, settle), result in zip(settles, done, strict=True):
            after_settle(gateway, settle, result, request.headers)
            code, answered = answer(result)
            results[row] = {"id": settle.job_id, "code": code, **answered}
    return JSONResponse({"results": results})
