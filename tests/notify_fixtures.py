"""Fixtures of the signal and notifier tests: Celery apps on the throwaway Redis and
a signal recorder. Test modules load them with ``pytest_plugins = ["tests.notify_fixtures"]``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery

from celery_zsched import notify
from celery_zsched.services.appstore import forget_app
from celery_zsched.worker import heartbeat
from tests.notify_helpers import MakeApp, Recorder
from tests.webhook_receiver import Receiver, running_receiver


@pytest.fixture
def notify_app(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeApp]:
    """``notify_app(**zsched_settings)``: a Celery app whose store is the throwaway Redis
    under a key prefix of its own; its notifier and store are dropped at teardown."""
    for name in list(os.environ):  # no ZSCHED_* of the developer's shell leaks in
        if name.startswith("ZSCHED_"):
            monkeypatch.delenv(name)
    apps: list[Celery] = []

    def make(**conf: Any) -> Celery:
        app = Celery("notify-tests", set_as_current=False)
        app.conf["broker_url"] = redis_url
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


@pytest.fixture
def signal_recorder() -> Iterator[Callable[[Celery], Recorder]]:
    """``signal_recorder(app)``: record the signals ``app`` sends (disconnected at teardown)."""
    made: list[Recorder] = []

    def make(app: Celery) -> Recorder:
        made.append(Recorder(app))
        return made[-1]
    yield make
    for rec in made:
        rec.close()


@pytest.fixture
def webhook_receiver() -> Iterator[Receiver]:
    """A local HTTP receiver of signed notification webhooks (secret ``s3cret``)."""
    with running_receiver("s3cret") as receiver:
        yield receiver
