"""A Celery app for the CLI tests: ``celery -A tests.cli_app zsched ...``.

The store's Redis URL and key prefix come from ``ZSCHED_REDIS_URL`` and
``ZSCHED_KEY_PREFIX``, which the tests point at their throwaway server.
"""

from __future__ import annotations

from celery import Celery

app = Celery("cli_app", broker="memory://", set_as_current=False)
app.conf.update(
    timezone="Europe/Berlin",
    # Without ZSCHED_REDIS_URL the store would fall back to localhost:6379, a
    # developer's Redis: point it at a port nothing listens on instead.
    zsched_redis_url="redis://127.0.0.1:1/0",
)
