"""What the management API answers: response models (they are the OpenAPI schemas,
and every answer is built through them, so an answer cannot drift from its schema)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from celery_zsched.core.recrawl import summary as recrawl_summary
from celery_zsched.core.results import JobInfo
from celery_zsched.services.preview import preview_info
from celery_zsched.store import Store
from celery_zsched.store.dead import iso


class JobState(BaseModel):
    """Where the job stands now, live from Redis."""

    status: str = Field(description="scheduled | queued | running | paused | dead | finished")
    paused: bool
    next_run_at: str | None = Field(description="When it is due next (ISO 8601 UTC); null "
                                                "while in flight, paused, dead or finished.")
    next_run_ms: int | None = Field(description="next_run_at as epoch ms (Redis' clock).")
    lease_until_ms: int | None = Field(
        description="Delivery deadline while queued, execution lease while running (epoch ms).")
    occurrence: int = Field(description="The current occurrence, named by its first due time "
                                        "(epoch ms).")
    attempt: int
    runs: int
    failures: int
    consecutive_failures: int
    last_outcome: str | None
    last_error: str | None
    last_run_at: str | None = Field(description="When the last run was settled (ISO 8601 UTC).")


class RecrawlView(BaseModel):
    """Change-aware recrawl: what the job's visits taught (interval jobs only)."""

    recrawl: str = Field(description="fixed | adaptive")
    interval_s: float | None = Field(description="The interval it runs at now (adaptive: the "
                                                 "one its last regular settle chose).")
    visits: float = Field(description="Visits that reported a change or not (decayed).")
    change_rate_per_day: float | None = Field(
        description="Estimated changes a day (Cho & Garcia-Molina); null: no reports yet.")
    estimator: str | None = Field(
        None, description="dated: every change seen was dated by the page's Last-Modified "
                          "(X / W); change-or-not: Cho's estimator from changed or not "
                          "alone; null: no reports yet.")
    expected_freshness: float | None = Field(
        description="Expected share of time the copy is fresh, at that rate and interval.")
    expected_age_s: float | None = Field(description="Expected age of the copy (Cho).")
    since_last_change_s: float | None = Field(description="Seconds since a visit last saw "
                                                          "a change.")


class FireView(BaseModel):
    """One upcoming run: it lands anywhere from ``utc`` to ``latest_utc`` (jitter)."""

    utc: str
    local: str
    timezone: str
    latest_utc: str
    jitter_s: float
    shifted: bool
    repeated: bool
    dst_note: str


class JobView(BaseModel):
    """A job: its definition (an import row that re-imports to it), and its live state."""

    id: str
    kind: str = Field(description="interval | cron | once")
    transport: str = Field(description="celery (beat publishes it) | http (the job gateway)")
    domain: str | None = Field(description="The domain its requests are paced under, if any.")
    static: bool = Field(description="It comes from beat_schedule: edit it there.")
    etag: str = Field(description="The definition's tag: send it as If-Match to PATCH only "
                                  "the definition you read.")
    definition: dict[str, Any]
    state: JobState
    recrawl: RecrawlView | None = Field(
        default=None, description="Change-aware recrawl (interval jobs).")
    fires: list[FireView] | None = Field(
        default=None, description="The next fires (GET /v1/jobs/{id} only; ?fires=N).")
    fires_note: str | None = Field(
        default=None, description="Why there are no fires, or fewer than asked.")


class JobPage(BaseModel):
    """One page of a walk over the jobs."""

    items: list[JobView]
    next_cursor: str | None = Field(
        description="Pass as ?cursor= for the next page; null once the walk is over. "
                    "A page may hold fewer items than the limit, even none, before the end.")


class Execution(BaseModel):
    """One settled run, from the settle stream."""

    id: str = Field(description="The settle event's stream id (cursor for ?before=).")
    at: str = Field(description="When it was settled (ISO 8601 UTC, Redis' clock).")
    occurrence: int
    attempt: int
    status: str = Field(description="complete | retrying | error | skipped | ...")
    error: str | None
    timings: dict[str, Any] = Field(
        description="Due, published, started times and the wait and lateness (ms), as recorded.")


class ExecutionPage(BaseModel):
    """A job's most recent runs, newest first."""

    items: list[Execution]
    next_cursor: str | None = Field(description="Pass as ?before= for older runs; null at the "
                                                "end of what the stream keeps.")


class RunResult(BaseModel):
    """What ``:run`` did."""

    id: str
    ran: bool = Field(description="False when the job is in flight: it is left alone.")
    detail: str


class ImportResult(BaseModel):
    """What an import did (or, dry, would do)."""

    total: int
    created: int
    updated: int
    rescheduled: int
    dry_run: bool
    seconds: float


class ProblemDetail(BaseModel):
    """An error (RFC 9457 problem+json); ``field`` names the request field at fault."""

    type: str
    title: str
    status: int
    detail: str | None = None
    field: str | None = None
    errors: list[dict[str, Any]] | None = Field(
        default=None, description="Every bad field of a body or query (field, message), "
                                  "or of an import every bad row (job number, line, field, "
                                  "message); field and detail are the first's.")
    error_count: int | None = None


def _iso(ms: int | None) -> str | None:
    return iso(ms) if ms is not None else None


def job_view(store: Store, info: JobInfo, *, static: bool = False, fires: int = 0,
             now_ms: int | None = None) -> JobView:
    """The answer for one job; with ``fires``, its next fires after ``now_ms``."""
    job, state = info.job, info.state
    view = JobView(
        id=job.id, kind=job.kind, transport=job.transport,
        domain=job.pacing_domain(store.settings), static=static, etag=info.tag,
        definition=job.to_dict(),
        state=JobState(
            status=info.status, paused=info.paused, next_run_at=_iso(info.due_ms),
            next_run_ms=info.due_ms, lease_until_ms=info.lease_until_ms,
            occurrence=state.occurrence, attempt=state.attempt, runs=state.runs,
            failures=state.failures, consecutive_failures=state.consecutive_failures,
            last_outcome=state.last_outcome, last_error=state.last_error,
            last_run_at=_iso(state.last_settled_ms)))
    if job.kind == "interval" and now_ms is not None:
        view.recrawl = RecrawlView(**recrawl_summary(job, state, now_ms))
    if fires and now_ms is not None:
        upcoming = preview_info(info, now_ms, fires, store.settings)
        view.fires = [FireView(**fire.to_dict()) for fire in upcoming.fires]
        view.fires_note = upcoming.note or None
    return view
