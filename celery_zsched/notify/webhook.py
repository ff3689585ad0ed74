"""The webhook notifier: each notice or digest POSTed as signed JSON, and
:func:`verify`, the check a receiver runs on what it gets."""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from celery_zsched.config import redact_url
from celery_zsched.services.notices import Message

logger = logging.getLogger("celery_zsched")

#: First wait before a webhook retry; each further retry doubles it.
RETRY_BASE_S = 1.0
#: Headers of a webhook request.
SIGNATURE_HEADER = "X-Zsched-Signature"
TIMESTAMP_HEADER = "X-Zsched-Timestamp"
EVENT_HEADER = "X-Zsched-Event"
def signature(secret: str | bytes, timestamp: str, body: bytes) -> str:
    """The ``X-Zsched-Signature`` value: ``sha256=`` HMAC-SHA256 of ``timestamp.body``.

    The timestamp is signed with the body so a captured request cannot be
    replayed later: receivers reject timestamps older than a few minutes.
    """
    key = secret.encode() if isinstance(secret, str) else secret
    mac = hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


#: How far a receiver's clock and a notice's timestamp may differ (a replay window).
VERIFY_TOLERANCE_S = 300


def verify(secret: str | bytes, headers: Mapping[str, Any], body: bytes, *,
           tolerance_s: float = VERIFY_TOLERANCE_S, now: float | None = None) -> bool:
    """For a webhook receiver: whether a request is a notice signed with ``secret``.

    ``headers`` is the request's headers (any mapping: names in any case, values as
    text or bytes) and ``body`` its raw bytes. True only if the signature is the
    HMAC-SHA256 of ``timestamp.body`` under ``secret``, compared in constant time,
    and the timestamp is within ``tolerance_s`` of ``now`` (default: this host's
    clock), so a captured request cannot be replayed later. Any bad input (a
    header missing, not ASCII or malformed, a body that is not bytes, an empty
    secret) is False, never an exception.
    """
    try:
        key = secret.encode() if isinstance(secret, str) else bytes(secret)
        timestamp = _header(headers, TIMESTAMP_HEADER)
        given = _header(headers, SIGNATURE_HEADER)
        if not key or timestamp is None or given is None or \
                not isinstance(body, bytes | bytearray | memoryview):
            return False
        # Unix seconds: ASCII digits only (int() also takes "+1_0", " 10" and Arabic digits).
        if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12) \
                or not given.isascii():
            return False
        clock = time.time() if now is None else now
        if not abs(clock - int(timestamp)) <= tolerance_s:
            return False
        expected = signature(key, timestamp, bytes(body))
        return hmac.compare_digest(given.encode("ascii"), expected.encode("ascii"))
    except (TypeError, ValueError, AttributeError, UnicodeError, OverflowError):
        return False


def _header(headers: Mapping[str, Any], name: str) -> str | None:
    """The value of header ``name`` in ``headers`` (any case), as text; None if absent."""
    value = headers.get(name)
    if value is None:
        wanted = name.lower()
        value = next((v for k, v in headers.items()
                      if isinstance(k, str | bytes) and
                      (k.decode("latin-1") if isinstance(k, bytes) else k).lower() == wanted),
                     None)
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return value.strip() if isinstance(value, str) else None


class DeliveryFailed(Exception):
    """A transport gave up on a message."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Refuse to follow a redirect: a notice goes to the configured URL or nowhere
    (followed, a 302 became a GET elsewhere, with the X-Zsched-* headers)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> None:
        return None  # urllib then raises HTTPError with the 3xx status


#: Opens webhook requests: urllib's own handlers, with redirects refused.
_OPENER = urllib.request.build_opener(_NoRedirects)


class Webhook:
    """POSTs each message as JSON, signed, with a timeout and retries with backoff."""

    name = "webhook"

    def __init__(self, url: str, secret: str = "", timeout_s: float = 5.0, retries: int = 3,
                 backoff_s: float = RETRY_BASE_S) -> None:
        self.url = url
        self.secret = secret
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s

    def request(self, message: Message) -> urllib.request.Request:
        """The signed request of ``message``, timestamped now."""
        body = message.to_json()
        timestamp = str(int(time.time()))
        headers = {"Content-Type": "application/json", "User-Agent": "celery-zsched",
                   EVENT_HEADER: message.event, TIMESTAMP_HEADER: timestamp}
        if self.secret:
            headers[SIGNATURE_HEADER] = signature(self.secret, timestamp, body)
        return urllib.request.Request(self.url, data=body, headers=headers, method="POST")

    def send(self, message: Message) -> None:
        """POST it; retry a 5xx, 408, 429 or network error; raise DeliveryFailed at the end."""
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                # Signed afresh each attempt: a late retry still has a fresh timestamp.
                with _OPENER.open(self.request(message), timeout=self.timeout_s):
                    return
            except urllib.error.HTTPError as exc:
                # A redirect (3xx, not followed) and other 4xx: sending again won't help.
                if exc.code < 500 and exc.code not in (408, 429):
                    raise DeliveryFailed(f"HTTP {exc.code} from {redact_url(self.url)}") from exc
                error: Exception = exc
            except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections
                error = exc
            if attempt < self.retries:
                logger.info("zsched: webhook attempt %d failed (%s); retrying in %.1fs",
                            attempt + 1, error, delay)
                time.sleep(delay)
                delay = min(delay * 2, 60.0)
        raise DeliveryFailed(f"{redact_url(self.url)}: {error} after {self.retries + 1} attempts")
