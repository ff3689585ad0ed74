"""The scrape task every sample job runs (``CELERY_ZSCHED_DEFAULT_TASK``)."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

from celery import shared_task

from celery_zsched.errors import JobFailed

#: Seconds to wait for a target; a hung target must not hold a worker slot forever.
FETCH_TIMEOUT_S = 10.0
#: Retry-After fallback when a 429 carries no usable header.
DEFAULT_RETRY_AFTER_S = 60.0


class TargetError(Exception):
    """The target answered with a server error (HTTP 5xx)."""


def retry_after_s(value: str | None) -> float:
    """Seconds from a ``Retry-After`` header (delta-seconds form; dates fall back)."""
    try:
        return max(0.0, float(value or ""))
    except ValueError:
        return DEFAULT_RETRY_AFTER_S


@shared_task(name="scrapers.tasks.scrape")
def scrape(url: str, meta: dict[str, Any] | None = None) -> dict[str, int]:
    """Fetch ``url`` and return ``{"status", "bytes"}``.

    Returning is a ``complete`` settle. A 5xx raises (an ``error`` settle,
    retried with backoff); a 429 raises :class:`JobFailed` with the target's
    ``Retry-After``, so the retry waits exactly as long as the target asked.
    """
    request = urllib.request.Request(url, headers={"User-Agent": "celery-zsched-example"})
    try:
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as resp:
            body = resp.read()
            return {"status": int(resp.status), "bytes": len(body)}
    except urllib.error.HTTPError as exc:
        if exc.code == 429:
            raise JobFailed(f"HTTP 429 from {url}",
                            retry_after=retry_after_s(exc.headers.get("Retry-After"))) from None
        if exc.code >= 500:
            raise TargetError(f"HTTP {exc.code} from {url}") from None
        # A 4xx other than 429 is an answer too: the job ran, the page is gone.
        return {"status": exc.code, "bytes": 0}
