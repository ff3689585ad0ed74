"""One store per Celery app, created lazily on first use."""

from __future__ import annotations

import threading
from typing import Any

from celery_zsched.config import Settings
from celery_zsched.store import Store

_lock = threading.Lock()
_stores: dict[int, Store] = {}


def app_timezone(app: Any) -> str:
    """The Celery app's time zone name (the default zone of cron jobs)."""
    tz = app.conf.timezone
    return str(tz) if tz else "UTC"


def store_for_app(app: Any) -> Store:
    """The :class:`Store` configured by ``app``'s ``zsched_*`` settings (cached)."""
    key = id(app)
    with _lock:
        store = _stores.get(key)
        if store is None:
            store = Store.from_settings(Settings.from_app(app), app_timezone(app))
            _stores[key] = store
        return store


def forget_app(app: Any) -> None:
    """Drop the cached store of ``app`` (after a fork, or in tests)."""
    with _lock:
        store = _stores.pop(id(app), None)
    if store is not None:
        store.client.close()
