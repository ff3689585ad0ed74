"""Running ``celery -A tests.cli_app zsched ...`` in-process against a throwaway store.

The CLI reads its settings from the environment (``ZSCHED_*``), and the store is
cached per app, so every test gets a fresh key prefix and a fresh store.
"""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery.bin.celery import celery
from click.testing import CliRunner, Result

from celery_zsched.services.appstore import forget_app

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.cli_app"


def cli_prefix(redis_url: str, monkeypatch: pytest.MonkeyPatch, tag: str,
               **settings: object) -> Iterator[str]:
    """Yield a fresh key prefix, set with ``settings`` in the app's ``ZSCHED_*`` environment."""
    value = "{" + tag + uuid.uuid4().hex[:8] + "}:"
    monkeypatch.setenv("ZSCHED_REDIS_URL", redis_url)
    monkeypatch.setenv("ZSCHED_KEY_PREFIX", value)
    for name, setting in settings.items():
        monkeypatch.setenv(f"ZSCHED_{name.upper()}", str(setting))
    monkeypatch.syspath_prepend(str(ROOT))
    app = importlib.import_module(APP).app
    forget_app(app)  # the store is cached per app: drop the last test's settings
    yield value
    forget_app(app)


def invoke(*args: str, input: str | None = None) -> Result:
    """``celery -A tests.cli_app zsched ARGS``; exceptions are not swallowed."""
    # Settings come from the environment: a test that changes it gets a new store.
    forget_app(importlib.import_module(APP).app)
    return CliRunner().invoke(celery, ["-A", APP, "zsched", *args], input=input,
                              catch_exceptions=False)
