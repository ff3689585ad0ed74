"""Fixtures of the signal and notifier tests: Celery apps on the throwaway Redis,
a signal recorder, and the worker's failure hook driven as a worker drives it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_zsched import heartbeat, notify, signals, worker
from celery_zsched.appstore import forget_app, store_for_app
from celery_zsched.job import Job
from celery_zsched.store import Claimed, Store

MakeApp = Callable[..., Celery]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ZSCHED_* variable of the developer's shell leaks into these tests."""
    for name in list(os.environ):
        if name.startswith("ZSCHED_"):
            monkeypatch.delenv(name)


@pytest.fixture
def make_app(redis_url: str) -> Iterator[MakeApp]:
    """``make_app(**zsched_settings)``: a Celery app whose store is the throwaway Redis
    under a key prefix of its own; its notifier and store are dropped at teardown."""
    apps: list[Celery] = []

    def make(**conf: Any) -> Celery:
        app = Celery("notify-tests", set_as_current=False)
        app.conf.broker_url = redis_url
        app.conf.zsched_redis_url = redis_url
        app.conf.zsched_key_prefix = "{n" + uuid.uuid4().hex[:8] + "}:"
        app.conf.zsched_max_jitter_s = 0
        app.conf.update({f"zsched_{name}": value for name, value in conf.items()})
        apps.append(app)
        return app
    yield make
    for app in apps:
        notify.uninstall(app)
        heartbeat._beats.pop(id(app), None)
        forget_app(app)


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


@pytest.fixture
def recorder() -> Iterator[Callable[[Celery], Recorder]]:
    """``recorder(app)``: record the signals ``app`` sends (disconnected at teardown)."""
    made: list[Recorder] = []

    def make(app: Celery) -> Recorder:
        made.append(Recorder(app))
        return made[-1]
    yield make
    for rec in made:
        rec.close()


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
