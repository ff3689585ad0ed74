"""Helpers of the signal and notifier tests: a signal recorder, jobs, and the
worker's failure hook driven as a worker drives it (fixtures: notify_fixtures)."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from celery import Celery

from celery_zsched import worker
from celery_zsched.core.job import Job
from celery_zsched.services import signals
from celery_zsched.services.appstore import store_for_app
from celery_zsched.services.signals import JobEvent
from celery_zsched.store import Claimed, Store

MakeApp = Callable[..., Celery]


class Recorder:
    """Every zsched signal ``app`` sends, as (signal name, event)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.seen: list[tuple[str, signals.Event]] = []
        for name, signal in signals.SIGNALS.items():
            signal.connect(self._receive, sender=app, weak=False,
                           dispatch_uid=f"recorder.{id(self)}.{name}")

    def _receive(self, signal: Any = None, sender: Any = None, event: Any = None,
                 **_: Any) -> None:
        assert sender is self.app
        self.seen.append((event.event, event))

    def names(self) -> list[str]:
        """The signal names seen, in order."""
        return [name for name, _ in self.seen]

    def close(self) -> None:
        for name, signal in signals.SIGNALS.items():
            signal.disconnect(self._receive, sender=self.app,
                              dispatch_uid=f"recorder.{id(self)}.{name}")


def url_job(n: int = 0, host: str = "a.example", **extra: Any) -> Job:
    """A URL job due at its first claim."""
    return Job.from_dict({"url": f"http://{host}/p/{n}", "interval_s": 3600, "jitter_s": 0,
                          "name": f"page {n}", "queue": "scrapes", **extra})


def started_then_lost(store: Store, count: int = 1000) -> list[str]:
    """``count`` URL jobs on 50 hosts, each started once and its worker "dead": the ids
    the reap dead-letters (what beat then signals). Needs ``max_deliveries`` 1 and a
    ``lease_s`` under 0.1 s."""
    jobs = [Job.from_dict({"url": f"http://s{i % 50}.example/{i}", "interval_s": 3600,
                           "jitter_s": 0}) for i in range(count)]
    store.upsert_many(jobs, stagger=False)
    store.run_now(*(job.id for job in jobs))
    batch = store.claim(count).jobs
    assert len(batch) == count
    for c in batch:
        assert store.start(c.job.id, c.occurrence, c.attempt).runs
    time.sleep(0.1)  # every execution lease runs out
    reaped = store.reap()
    assert reaped.dead == count
    return reaped.dead_ids


def claim_one(store: Store, job: Job) -> Claimed:
    """Make ``job`` due now and claim it."""
    store.upsert(job)
    store.run_now(job.id)
    (claimed,) = [c for c in store.claim().jobs if c.job.id == job.id]
    return claimed


def fail_in_worker(app: Celery, claimed: Claimed, exc: BaseException | None = None, *,
                   start: bool = True) -> float:
    """Start ``claimed`` and fail it through the worker's own ``task_failure`` hook;
    the seconds the hook took."""
    store = store_for_app(app)
    started = None
    if start:
        started = store.start(claimed.job.id, claimed.occurrence, claimed.attempt)
        assert started.runs
    # As the worker's start hook leaves it: the settle presents the start's fence.
    task = SimpleNamespace(app=app, request=SimpleNamespace(
        headers=claimed.headers(), id=claimed.task_id, zsched_start=started))
    began = time.perf_counter()
    worker.on_failure(sender=task, task_id=claimed.task_id,
                      exception=exc if exc is not None else ValueError("boom"))
    return time.perf_counter() - began


def job_event(n: int, event: str = "job_dead_lettered") -> JobEvent:
    """An event of job ``job-<n>``, as a signal would carry it."""
    return JobEvent(event=event, job_id=f"job-{n}", name=f"page {n}",
                    url=f"http://a.example/p/{n}", task="scrape", queue=None, error="boom",
                    occurrence=1, attempt=1, consecutive_failures=1,
                    at_ms=int(time.time() * 1000))


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``predicate`` every 20 ms until it holds; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)
