"""The scrape task every sample job runs (``CELERY_ZSCHED_DEFAULT_TASK``)."""

from __future__ import annotations

import hashlib
import math
import urllib.error
import urllib.request
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any

from celery import shared_task

from celery_zsched.errors import JobFailed
from celery_zsched.worker import report, validators

#: Seconds to wait for a target; a hung target must not hold a worker slot forever.
FETCH_TIMEOUT_S = 10.0


def retry_after_s(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait, or ``None`` (absent or unreadable).

    The header is either delta-seconds (``120``) or an HTTP date. ``None``
    rather than a guess: with pacing on, a 429 without a usable wait makes the
    scheduler back off the site's delay adaptively instead.
    """
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # HTTP dates are GMT; a zone-less one is read as such
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


@shared_task(name="scrapers.tasks.scrape")
def scrape(url: str, meta: dict[str, Any] | None = None) -> dict[str, int]:
    """Fetch ``url`` (conditionally, with the last visit's validators) and return
    ``{"status", "bytes"}``.

    A ``304`` reports a visit without change; a 2xx reports the content's hash and
    its ``ETag`` / ``Last-Modified`` for the next request.

    A 2xx reports ``complete`` with its status. Any HTTP error status raises
    :class:`JobFailed` with that status and the target's ``Retry-After``: the
    job retries with backoff (or exactly as long as the target asked), and,
    with pacing on, the status feeds the site's pacing: a 429 or a 503 with
    ``Retry-After`` closes the site's gate, a 429 without slows it down, and
    failures count towards its breaker. A network error (refused, timed out)
    raises as it is: an error without a status.
    """
    # A conditional GET: the validators of the last visit (none on the first).
    headers = {"User-Agent": "celery-zsched-example", **validators()}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as resp:
            body = resp.read()
            status = int(resp.status)
            etag, modified = resp.headers.get("ETag"), resp.headers.get("Last-Modified")
    except urllib.error.HTTPError as exc:
        if exc.code == 304:
            # Not modified: a visit without change, and a success for pacing.
            report("complete", status=304)
            return {"status": 304, "bytes": 0}
        # The worker would read exc.code and exc.headers itself; explicit is
        # clearer, and the message stays short (no traceback of urllib's).
        raise JobFailed(f"HTTP {exc.code} from {url}", status=exc.code,
                        retry_after=retry_after_s(exc.headers.get("Retry-After"))) from None
    # Explicit, though returning alone settles "complete": the status is what
    # the site's pacing counts as a success.
    # The content's hash tells the store whether it changed since the last visit
    # (change-aware recrawl); the validators make the next request conditional.
    report("complete", status=status, signature=hashlib.sha1(body).hexdigest(),
           etag=etag, last_modified=modified)
    return {"status": status, "bytes": len(body)}
