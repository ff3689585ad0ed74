"""What the management API accepts: job definitions to create, and edits.

A body is validated by :meth:`Job.from_dict`, the one validator every way in
shares (CLI, imports, the admin, beat_schedule), so the API accepts exactly what
an import row does. The pydantic models here only describe it, for the OpenAPI
document: :func:`JobFields` is an import row, :class:`JobPatch` an edit.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from celery_zsched.core.errors import ValidationError
from celery_zsched.core.job import Defaults, Job
from celery_zsched.server.problems import bad_field, invalid_job

#: Largest body of a create or an edit (meta, args and kwargs included).
MAX_JOB_BODY = 256 * 1024

Time = str | float | None
_TIME = "ISO 8601 (naive: in the job's time zone) or epoch seconds."


class JobFields(BaseModel):
    """A job definition, as an import row. Give ``url`` or ``id`` (or both), and at most one
    of ``interval_s``, ``cron`` and ``run_at`` (none: the default interval)."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, max_length=200, pattern=r"^[A-Za-z0-9_.:@/\-]{1,200}$",
                           description="Default: derived from the URL.")
    url: str | None = Field(None, max_length=2000, description="http(s) URL to fetch.")
    task: str | None = Field(None, max_length=200, description="Celery task name.")
    name: str | None = Field(None, max_length=200)
    interval_s: float | None = Field(None, description="Run every this many seconds.")
    cron: str | None = Field(None, description="Five-field cron expression.")
    timezone: str | None = Field(None, description="IANA zone of cron and naive times.")
    day_rule: Literal["or", "and"] | None = Field(
        None, description="How a cron's day-of-month and day-of-week combine.")
    run_at: Time = Field(None, description=f"Run once at this time: {_TIME}")
    start_at: Time = Field(None, description=f"Not before: {_TIME}")
    end_at: Time = Field(None, description=f"Not after: {_TIME}")
    meta: dict[str, Any] | None = None
    args: list[Any] | None = None
    kwargs: dict[str, Any] | None = None
    jitter_s: float | None = None
    queue: str | None = Field(None, max_length=200)
    routing_key: str | None = Field(None, max_length=200)
    priority: int | None = Field(None, ge=0, le=255)
    expires_s: float | None = None
    enabled: bool | None = None
    max_runs: int | None = Field(None, ge=1)
    misfire_grace_s: float | None = None
    retry_max: int | None = Field(None, ge=0, le=1000)
    retry_base_s: float | None = None
    domain: str | None = Field(None, description="Pace under this domain, not the URL's host.")
    transport: Literal["celery", "http"] | None = Field(
        None, description="celery: beat publishes it; http: the job gateway hands it out.")
    recrawl: Literal["fixed", "adaptive"] | None = Field(
        None, description="fixed: every interval_s; adaptive: the interval follows the "
                          "page's estimated change rate (interval jobs only).")
    min_interval_s: float | None = Field(None, description="Shortest adaptive interval.")
    max_interval_s: float | None = Field(None, description="Longest adaptive interval.")
    freshness_target: float | None = Field(
        None, gt=0, lt=1, description="Share of time an adaptive job's copy should be fresh.")


class JobPatch(JobFields):
    """An edit: the fields given replace the stored ones (``null`` resets a field to its
    default); ``status`` pauses or resumes. The id cannot change."""

    status: Literal["paused", "active"] | None = Field(
        None, description="paused: pause it; active: resume it (never earlier than its "
                          "interval after its last run).")


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """The ``openapi_extra`` that documents a JSON body of ``model``."""
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": model.model_json_schema()}}}}


#: Most fields one answer names.
MAX_FIELD_ERRORS = 30
#: Values that stand in for a refused field that other checks depend on: a job
#: without a url needs an id and a task, so dropping a bad url would add errors.
_STAND_INS = {"url": "https://example.invalid/", "id": "x", "task": "x"}


def _validated(data: dict[str, Any], defaults: Defaults) -> Job:
    """``data`` as a job; ``400`` naming every bad field, not only the first.

    :meth:`Job.from_dict` stops at the first error, and stays that fast for imports.
    Only once it has failed, the refused field is set aside (or replaced by a
    stand-in that other checks need) and the rest validated again, until it passes.
    """
    try:
        return Job.from_dict(data, defaults)
    except ValidationError as first:
        errors, rest = [first], dict(data)
        while len(errors) < MAX_FIELD_ERRORS:
            field = errors[-1].field
            if field in _STAND_INS and rest.get(field) != _STAND_INS[field]:
                rest[field] = _STAND_INS[field]
            elif field in rest and field not in _STAND_INS:
                del rest[field]
            else:
                break
            try:
                Job.from_dict(rest, defaults)
            except ValidationError as exc:
                if any(e.field == exc.field for e in errors):
                    break  # a stand-in's own complaint: nothing new to say
                errors.append(exc)
            else:
                break
        raise invalid_job(first, errors[1:]) from None


def new_job(data: dict[str, Any], defaults: Defaults) -> Job:
    """A create's body as a job; ``400`` naming every bad field."""
    return _validated(data, defaults)


def edited_job(current: Job, patch: dict[str, Any], defaults: Defaults) -> Job:
    """``current`` with ``patch``'s fields replaced (not ``status``); ``400`` naming every
    bad field."""
    if "id" in patch and patch["id"] != current.id:
        raise bad_field("id", "cannot change; create a new job and delete this one")
    fields = {k: v for k, v in patch.items() if k != "status"}
    merged = current.to_dict()
    for name, value in fields.items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    # The timing fields exclude each other: setting one clears the others.
    timing = [name for name in ("interval_s", "cron", "run_at") if fields.get(name) is not None]
    if len(timing) == 1:
        for other in {"interval_s", "cron", "run_at"} - set(timing):
            merged.pop(other, None)
    return _validated(merged, defaults)


def status_of(patch: dict[str, Any]) -> str | None:
    """The ``status`` an edit asks for (``paused``/``active``), or ``None``."""
    status = patch.get("status")
    if status is None:
        return None
    if status not in ("paused", "active"):
        raise bad_field("status", 'must be "paused" or "active"')
    if "enabled" in patch and patch["enabled"] is not None and \
            bool(patch["enabled"]) != (status == "active"):
        raise bad_field("status", "contradicts enabled; give one of them")
    return str(status)

