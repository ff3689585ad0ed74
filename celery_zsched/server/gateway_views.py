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
