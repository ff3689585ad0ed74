"""The next N fire times of a job, by the same rules beat schedules it with.

Cron slots come from :func:`timing.cron_next` (through :meth:`Job._cron_after`)
and their DST flags from :func:`timing.cron_dst_flags`, so a preview can never
disagree with the scheduler about gaps and folds. Interval jobs count from
the due time the store holds: the next run after a completion is
``completion + interval + jitter``, so each listed time is the earliest the
run can start (run time and jitter only push later runs back).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from celery_zsched.config import Settings
from celery_zsched.core.job import Job
from celery_zsched.core.recrawl import current_interval_s
from celery_zsched.core.results import JobInfo
from celery_zsched.core.state import RuntimeState
from celery_zsched.core.timing import cron_dst_flags, ms_to_dt

#: Statuses that never fire again until someone acts (resume, requeue, edit).
_STOPPED = {"paused": "paused: resume it to schedule it again",
            "dead": "dead-lettered: `zsched dead requeue` runs it again",
            "finished": "finished: it will not run again"}
#: Statuses of a run in flight: not in the schedule, rescheduled when it settles.
_IN_FLIGHT = {"queued", "running", "leased"}


@dataclass(frozen=True)
class Fire:
    """One upcoming run: it lands anywhere in ``[utc_ms, utc_ms + jitter_ms]``."""

    utc_ms: int
    timezone: str
    jitter_ms: int = 0
    #: A DST gap skipped the wall time this cron slot stands for; it fires later.
    shifted: bool = False
    #: Its wall time comes twice in a DST fold, and the job fires in both passes.
    repeated: bool = False

    @property
    def utc(self) -> datetime:
        return ms_to_dt(self.utc_ms)

    @property
    def local(self) -> datetime:
        """The time in the job's zone (its offset tells the two passes of a fold apart)."""
        return self.utc.astimezone(ZoneInfo(self.timezone))

    @property
    def latest_ms(self) -> int:
        return self.utc_ms + self.jitter_ms

    @property
    def dst_note(self) -> str:
        """What DST did to this fire, in the words the CLI, the admin and the live
        preview all show ("" for most fires)."""
        marks = []
        if self.shifted:
            marks.append("shifted: a DST gap skipped its wall time")
        if self.repeated:
            marks.append(f"repeated: DST fold, pass {self.local.fold + 1} of 2")
        return "; ".join(marks)

    def to_dict(self) -> dict[str, Any]:
        return {"utc": _iso(self.utc), "local": self.local.isoformat(),
                "timezone": self.timezone, "latest_utc": _iso(ms_to_dt(self.latest_ms)),
                "jitter_s": self.jitter_ms / 1000, "shifted": self.shifted,
                "repeated": self.repeated, "dst_note": self.dst_note}


@dataclass(frozen=True)
class Preview:
    """The fires, and why there are none or fewer than asked (``note``)."""

    fires: list[Fire] = field(default_factory=list)
    #: ``scheduled``, or the status that stops it (``paused``, ``dead``, ``finished``).
    status: str = "scheduled"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "note": self.note,
                "fires": [f.to_dict() for f in self.fires]}


def _iso(dt: datetime) -> str:
    return dt.isoformat(timespec="seconds").replace("+00:00", "Z")


def next_fires(job: Job, after_ms: int, n: int, settings: Settings,
               state: RuntimeState | None = None, due_ms: int | None = None) -> list[Fire]:
    """Up to ``n`` fires after ``after_ms``; empty for a paused or finished job.

    ``state`` gives the runs already counted against ``max_runs``, and
    ``due_ms`` the store's current due time (the next fire of a stored job).
    """
    return preview(job, after_ms, n, settings, state, due_ms).fires


def preview_info(info: JobInfo, after_ms: int, n: int, settings: Settings) -> Preview:
    """The preview of a stored job, from its definition and live state."""
    status = "paused" if info.paused else info.state.status
    return preview(info.job, after_ms, n, settings, info.state, info.due_ms, status)


def preview(job: Job, after_ms: int, n: int, settings: Settings,
            state: RuntimeState | None = None, due_ms: int | None = None,
            status: str | None = None) -> Preview:
    """Like :func:`next_fires`, saying why the list is empty or cut short."""
    state = state or RuntimeState()
    status = status or state.status
    if not job.enabled:
        status = "paused"
    if status in _STOPPED:
        return Preview([], status, _STOPPED[status])
    left = None if job.max_runs is None else job.max_runs - state.runs
    if left is not None and left <= 0:
        return Preview([], "finished", f"finished: max_runs ({job.max_runs}) reached")
    want = n if left is None else min(n, left)
    fires: list[Fire] = []
    in_flight = status in _IN_FLIGHT
    for fire in _candidates(job, after_ms, settings, state, due_ms, in_flight):
        if len(fires) >= want or (job.end_at is not None and fire.utc_ms > job.end_at):
            break
        if job.end_at is not None and fire.latest_ms > job.end_at:
            # A jitter that lands past end_at ends the job instead (Job._clamp),
            # so this fire may not happen: its window stops at end_at.
            fire = Fire(fire.utc_ms, fire.timezone, job.end_at - fire.utc_ms,
                        fire.shifted, fire.repeated)
        fires.append(fire)
    return Preview(fires, "scheduled", _why_short(job, fires, n, left))


def _why_short(job: Job, fires: list[Fire], n: int, left: int | None) -> str:
    if len(fires) >= n:
        return ""
    if left is not None and len(fires) == left:
        return f"then finished: max_runs ({job.max_runs}) reached"
    if job.end_at is not None:
        return f"then finished: end_at {_iso(ms_to_dt(job.end_at))}"
    return "then finished: a one-off job" if job.kind == "once" else ""


def _candidates(job: Job, after_ms: int, settings: Settings, state: RuntimeState,
                due_ms: int | None, in_flight: bool) -> Iterator[Fire]:
    jitter = round(job.effective_jitter_s(settings) * 1000)
    if job.kind == "once":
        # A one-off has no jitter (Job.first_due_ms) and runs once.
        if state.runs == 0:
            assert job.run_at is not None
            yield Fire(due_ms if due_ms is not None else job.run_at, job.timezone)
        return
    if job.kind == "cron":
        yield from _cron(job, after_ms, jitter, due_ms)
        return
    # An adaptive job's later fires: at the interval its last settle chose (each
    # later visit may change it; this is the estimate as of now).
    interval = current_interval_s(job, state)
    assert interval is not None
    step = round(interval * 1000)
    if due_ms is not None:
        # The stored due time already holds its drawn jitter: it is exact.
        yield Fire(due_ms, job.timezone)
        t = due_ms + step
    elif in_flight:
        # Running now: the next run counts from its completion, an interval on.
        t = max(after_ms + step, job.start_at or 0)
    else:
        t = max(after_ms, job.start_at or 0)
    while True:
        yield Fire(t, job.timezone, jitter)
        t += step


def _cron(job: Job, after_ms: int, jitter: int, due_ms: int | None) -> Iterator[Fire]:
    assert job.cron is not None
    tz = ZoneInfo(job.timezone)
    if due_ms is not None:
        # The stored due time is its slot plus the jitter drawn for it; the
        # slot (for the DST flags) is the first one from a jitter earlier.
        slot = job._cron_after(due_ms - jitter - 1)
        shifted, repeated = (cron_dst_flags(job.cron, tz, ms_to_dt(slot), job.day_rule)
                             if slot <= due_ms else (False, False))
        yield Fire(due_ms, job.timezone, 0, shifted, repeated)
        # The next slot is taken after the run, which is at the due time or later.
        t = due_ms
    else:
        t = max(after_ms, (job.start_at or 0) - 1)
    while True:
        t = job._cron_after(t)
        shifted, repeated = cron_dst_flags(job.cron, tz, ms_to_dt(t), job.day_rule)
        yield Fire(t, job.timezone, jitter, shifted, repeated)
