"""Local scrape targets: fake RSS feeds that answer fast, slowly, with 500 or with 429."""

from __future__ import annotations

import random
import time
from datetime import datetime, timezone

from django.http import HttpRequest, HttpResponse

#: The ``Retry-After`` a rate-limited feed sends (seconds).
RETRY_AFTER_S = 45


def _rss(n: int, items: int = 10) -> str:
    now = datetime.now(timezone.utc).strftime("%a, %d %b %Y %H:%M:%S +0000")
    entries = "".join(
        f"<item><title>Feed {n} item {i}</title>"
        f"<link>http://127.0.0.1:8000/targets/feed/{n}.xml#{i}</link>"
        f"<pubDate>{now}</pubDate></item>"
        for i in range(items)
    )
    return (f'<?xml version="1.0"?><rss version="2.0"><channel><title>Feed {n}</title>'
            f"<link>http://127.0.0.1:8000/</link><description>fake feed</description>"
            f"{entries}</channel></rss>")


def _xml(body: str, status: int = 200) -> HttpResponse:
    return HttpResponse(body, status=status, content_type="application/rss+xml")


def feed(request: HttpRequest, n: int) -> HttpResponse:
    """A healthy feed: 200 with a few items."""
    return _xml(_rss(n))


def slow(request: HttpRequest, n: int) -> HttpResponse:
    """A sluggish feed: 200 after 1-3 s (shows duration_ms in the run history)."""
    time.sleep(random.uniform(1.0, 3.0))
    return _xml(_rss(n))


def error(request: HttpRequest, n: int) -> HttpResponse:
    """A broken feed: always 500, so its job shows failures and backoff."""
    return _xml("<error>upstream exploded</error>", status=500)


def ratelimited(request: HttpRequest, n: int) -> HttpResponse:
    """A rate-limited feed: 429 with ``Retry-After``, honoured by the retry."""
    response = _xml("<error>slow down</error>", status=429)
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response
