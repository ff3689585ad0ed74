"""What the job gateway answers: response models (the OpenAPI schemas; every answer is
built through them, so an answer cannot drift from its schema)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class JobOffer(BaseModel):
    """``GET /jobs/next``: a claimed job, and the lease the worker echoes back."""

    id: str
    url: str | None
    interval_s: float | None
    cron: str | None
    timezone: str | None
    meta: dict[str, Any]
    queue: str | None
    task: str | None
    args: list[Any]
    kwargs: dict[str, Any]
    occurrence: int = Field(description="The occurrence, named by its first due time "
                                        "(epoch ms).")
    attempt: int
    deliveries: int = Field(description="How often this attempt was handed out (a lease "
                                        "that ran out hands it out again).")
    lease: str = Field(description="Echo it in the report, as is.")
    lease_s: float = Field(description="Seconds the lease lasts without a heartbeat.")
    scheduled_at: int | None = Field(description="When it fell due (epoch ms, Redis' clock).")
    picked_up_at: int | None = Field(description="When it was claimed (epoch ms, Redis' "
                                                  "clock).")
    traceparent: str | None = Field(
        default=None, description="With zsched_tracing: the W3C trace context of this "
        "hand-out's span. Continue the trace from it, and send it (or your own span's) as "
        "the report's traceparent header.")
    etag: str | None = Field(None, description="The last visit's ETag: send it as "
                                               "If-None-Match.")
    last_modified: str | None = Field(None, description="The last visit's Last-Modified: "
                                                        "send it as If-Modified-Since.")
    signature: str | None = Field(None, description="The last visit's content signature.")


class Settled(BaseModel):
    """A report that applied."""

    applied: bool = Field(description="Always true here.")
    outcome: str = Field(description="What the settle did: complete | retrying | error | ...")
    status: str
    next_run_at: int | None = Field(description="When the job runs next (epoch ms), if it does.")


class NotSettled(BaseModel):
    """``409``: a stale or repeated report; nothing changed."""

    applied: bool = Field(description="Always false here.")
    reason: str = Field(description="Why: stale | unknown | ...")
    detail: str


class Extended(BaseModel):
    """A heartbeat that extended the lease."""

    extended: bool = Field(description="Always true here.")
    lease_s: float = Field(description="Seconds the lease now lasts from now.")


class NotExtended(BaseModel):
    """``409``: the lease is no longer held; nothing changed."""

    extended: bool = Field(description="Always false here.")
    detail: str


class JobBatch(BaseModel):
    """``GET /jobs/next?max=N``: 1 to N claimed jobs, each under a lease of its own."""

    jobs: list[JobOffer]


class ReportSettled(Settled):
    """One report of a batch that applied (``code`` 200)."""

    id: str
    code: int = Field(description="200: the status the report alone would have got.")


class ReportNotSettled(NotSettled):
    """One report of a batch that was stale or repeated: nothing changed (``code`` 409)."""

    id: str
    code: int = Field(description="409: the status the report alone would have got.")


class ReportInvalid(BaseModel):
    """One report of a batch that was malformed, or whose lease is not one (``code`` 400):
    nothing changed. The fields as a problem+json answer has them."""

    id: str | None = Field(description="The report's id, if it was a job id.")
    code: int = Field(description="400: the status the report alone would have got.")
    title: str
    detail: str
    field: str = Field(description="The field at fault, as reports.<row>.<field>.")
    errors: list[dict[str, str]] = Field(description="Every field at fault: field, message.")


class ReportResults(BaseModel):
    """``POST /jobs/report``: one answer per report, in the order they were sent."""

    results: list[ReportSettled | ReportNotSettled | ReportInvalid]
