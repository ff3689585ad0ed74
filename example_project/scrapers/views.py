"""Local scrape targets: fake RSS feeds that answer fast, slowly, with 500, 429 or 503.

``serve_targets`` serves them on the loopback hosts of :mod:`scrapers.hosts`,
so each problem target is a site of its own to the scheduler's pacing.
"""

from __future__ import annotations

import os
import random
import threading
import time
from datetime import datetime, timezone

from django.http import HttpRequest, HttpResponse
from django.utils.http import http_date, parse_http_date_safe

#: The ``Retry-After`` a rate-limited answer sends (seconds): short, so the
#: closed gate opens and closes again while you watch ``zsched domains``.
RETRY_AFTER_S = 10
#: How long the flaky target is down after the server process starts (s):
#: long enough for its site's breaker to open and probe again at least once.
FLAKY_FOR_S = float(os.environ.get("SCRAPERS_FLAKY_S", "120"))

# Read when the server imports this module: runserver's checks and
# serve_targets both load the URLconf at start-up, so this is the process start.
_STARTED = time.monotonic()
#: The rate-limited target answers every this many-th request with 429. A 429
#: is a failed request to the breaker too: one in two stays below the project's
#: breaker ratio (0.8), so this site shows throttling alone.
RATELIMIT_EVERY = 2
# Requests the rate-limited target has answered; the lock keeps the count
# exact under a thread per request.
_ratelimited_lock = threading.Lock()
_ratelimited_count = 0


def _rss(request: HttpRequest, n: int, items: int = 10, stamp: float | None = None) -> str:
    when = datetime.now(timezone.utc) if stamp is None else datetime.fromtimestamp(
        stamp, timezone.utc)
    now = when.strftime("%a, %d %b %Y %H:%M:%S +0000")
    # Links on the host that was asked: the feeds live on several loopback hosts.
    site = f"http://{request.get_host()}"
    entries = "".join(
        f"<item><title>Feed {n} item {i}</title>"
        f"<link>{site}/targets/feed/{n}.xml#{i}</link>"
        f"<pubDate>{now}</pubDate></item>"
        for i in range(items)
    )
    return (f'<?xml version="1.0"?><rss version="2.0"><channel><title>Feed {n}</title>'
            f"<link>{site}/</link><description>fake feed</description>"
            f"{entries}</channel></rss>")


def _xml(body: str, status: int = 200) -> HttpResponse:
    return HttpResponse(body, status=status, content_type="application/rss+xml")


#: A healthy feed publishes a new version every this many seconds (staggered by
#: feed), so conditional requests in between answer 304.
FEED_VERSION_S = int(os.environ.get("SCRAPERS_FEED_VERSION_S", "300"))


def feed(request: HttpRequest, n: int) -> HttpResponse:
    """A healthy feed: 200 with a few items, an ``ETag`` and a ``Last-Modified``; a
    request whose ``If-None-Match`` (or ``If-Modified-Since``) still matches gets 304."""
    version = int((time.time() + n * 37) // FEED_VERSION_S)
    published = version * FEED_VERSION_S - n * 37
    etag = f'"feed-{n}-v{version}"'
    modified = http_date(published)
    match = request.headers.get("If-None-Match")
    since = parse_http_date_safe(request.headers.get("If-Modified-Since") or "")
    if match == etag or (match is None and since is not None and since >= int(published)):
        response = HttpResponse(status=304)
    else:
        response = _xml(_rss(request, n, stamp=published))
    response["ETag"], response["Last-Modified"] = etag, modified
    return response


def slow(request: HttpRequest, n: int) -> HttpResponse:
    """A sluggish feed: 200 after 1-3 s (shows duration_ms in the run history)."""
    time.sleep(random.uniform(1.0, 3.0))
    return _xml(_rss(request, n))


def error(request: HttpRequest, n: int) -> HttpResponse:
    """A broken feed: always 500, so its job shows failures and backoff."""
    return _xml("<error>upstream exploded</error>", status=500)


def ratelimited(request: HttpRequest, n: int) -> HttpResponse:
    """A rate-limited site: every other request (the 2nd, 4th, ...) is a 429 with
    ``Retry-After``, which closes the site's gate for that long; the others are 200."""
    global _ratelimited_count
    with _ratelimited_lock:
        _ratelimited_count += 1
        limited = _ratelimited_count % RATELIMIT_EVERY == 0
    if not limited:
        return _xml(_rss(request, n))
    response = _xml("<error>slow down</error>", status=429)
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


def flaky(request: HttpRequest, n: int) -> HttpResponse:
    """A site that is down, then recovers: 503 without ``Retry-After`` for the first
    :data:`FLAKY_FOR_S` seconds of the server process, 200 after.

    No ``Retry-After``: nothing says when to come back, so the failures count
    towards the site's breaker, which opens and then probes until it recovers.
    """
    if time.monotonic() - _STARTED < FLAKY_FOR_S:
        return _xml("<error>service unavailable</error>", status=503)
    return _xml(_rss(request, n))
