"""Helpers of the signal and notifier tests: a signal recorder, jobs, and the
worker's failure hook driven as a worker drives it (fixtures: notify_fixtures)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from celery import Celery

from celery_zsched import signals, worker
from celery_zsched.appstore import store_for_app
from celery_zsched.job import Job
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


def claim_one(store: Store, job: Job) -> Claimed:
    """Make ``job`` due now and claim it."""
    store.upsert(job)
    store.run_now(job.id)
    (claimed,) = [c for c in store.claim().jobs if c.job.id == job.id]
    return claimed


def fail_in_worker(app: Celery, claimed: Claimed, exc: BaseException | None = None, *,
                   start: bool = True) -> None:
    """Start ``claimed`` and fail it through the worker's own ``task_failure`` hook."""
    store = store_for_app(app)
    if start:
        assert store.start(claimed.job.id, claimed.occurrence, claimed.attempt).runs
    task = SimpleNamespace(app=app, request=SimpleNamespace(headers=claimed.headers(),
                                                            id=claimed.task_id))
    worker.on_failure(sender=task, task_id=claimed.task_id,
                      exception=exc if exc is not None else ValueError("boom"))
