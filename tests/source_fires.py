"""Ask another scheduler's own schedule objects when they fire, to check moved jobs against.

django-celery-beat and redbeat both decide with a Celery schedule object
(``schedule``, ``crontab``, django-celery-beat's ``TzAwareCrontab`` and
``clocked``): ``remaining_estimate(last_run_at)`` is the time left until the
next fire, and ``is_due(last_run_at)`` turns true at that instant. Their clock
is frozen here by setting ``nowfun``, so the answers are exact.
"""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any

from celery_zsched.config import Settings
from celery_zsched.core.job import Job
from celery_zsched.core.timing import dt_to_ms, ms_to_dt

#: Later fires compared per recurring job.
CHAIN = 40


def frozen(sched: Any, now: datetime) -> Any:
    """``sched`` with its clock stopped at ``now``."""
    sched.nowfun = lambda: now
    return sched


def source_next(sched: Any, last_run_at: datetime | None, now: datetime) -> datetime:
    """The source's next fire after ``last_run_at``, asked at ``now``."""
    return now + frozen(sched, now).remaining_estimate(last_run_at)


def assert_due_flips_at(sched: Any, last_run_at: datetime | None, due_ms: int) -> None:
    """The source's ``is_due`` is false 1 ms before ``due_ms`` and true at it."""
    before = frozen(sched, ms_to_dt(due_ms - 1)).is_due(last_run_at)
    at = frozen(sched, ms_to_dt(due_ms)).is_due(last_run_at)
    assert (before[0], at[0]) == (False, True), (sched, last_run_at, ms_to_dt(due_ms))


def check_chain(job: Job, sched: Any, start: datetime, count: int = CHAIN) -> int:
    """Fire after fire from ``start``: zsched's next run equals the source's; returns ``count``.

    Each fire is taken as the last run of the next (a task that completes at
    once), which is how both sides compute what comes next.
    """
    settings, rng = Settings(max_jitter_s=0.0), random.Random(0)
    last = start
    for _ in range(count):
        ours = job.next_regular_ms(dt_to_ms(last), settings, rng)
        theirs = source_next(sched, last, last)
        assert ours is not None
        assert ms_to_dt(ours) == theirs.astimezone(ms_to_dt(0).tzinfo), (
            job.id, job.cron, job.timezone, last, ms_to_dt(ours), theirs)
        last = theirs
    return count


def save_redbeat_entry(app: Any, name: str, schedule: Any, *, last_run_at: datetime | None,
                       task: str = "proj.tasks.work", **fields: Any) -> Any:
    """Write one entry with redbeat's own ``RedBeatSchedulerEntry.save()``; returns it."""
    from redbeat.schedulers import RedBeatSchedulerEntry

    entry = RedBeatSchedulerEntry(name, task, schedule, app=app, **fields)
    # ScheduleEntry sets last_run_at to now when given none: say what we mean.
    entry.last_run_at = last_run_at
    return entry.save()


def load_redbeat_entry(app: Any, name: str) -> Any:
    """The entry as redbeat's scheduler loads it (``from_key``)."""
    from redbeat.schedulers import RedBeatSchedulerEntry

    return RedBeatSchedulerEntry.from_key(app.redbeat_conf.key_prefix + name, app=app)
