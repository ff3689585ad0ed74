"""The Celery app of the quick-start demo; configured entirely from the environment."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from typing import Any

from celery import Celery

import celery_zsched.worker  # noqa: F401  (installs the settle hooks)
from celery_zsched.errors import JobFailed

app = Celery("demo_app", broker=os.environ.get("DEMO_BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    zsched_default_task="demo_app.scrape",
    worker_hijack_root_logger=True,
    broker_connection_retry_on_startup=True,
)


@app.task(name="demo_app.scrape")
def scrape(url: str, meta: dict[str, Any]) -> dict[str, Any]:
    """Fetch ``url``; a 5xx is an error, a 429 asks to be retried after Retry-After."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = resp.read()
            return {"status": resp.status, "bytes": len(body), "feed": meta.get("feed")}
    except urllib.error.HTTPError as exc:
        if exc.code == 429:
            retry_after = float(exc.headers.get("Retry-After", 2))
            raise JobFailed("HTTP 429", retry_after=retry_after) from exc
        raise RuntimeError(f"HTTP {exc.code} from {url}") from exc
