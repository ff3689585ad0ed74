"""The webhook's edges: ``notify.verify`` returns a bool for any input, and the notifier
follows no redirect.

``verify`` is what the README tells receivers to use; the checks are the ones the
README's old snippet failed (a TypeError, KeyError or ValueError on a non-ASCII
signature, a missing header or a bad timestamp), then a property-based run over
any headers and body.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_zsched.notify import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    DeliveryFailed,
    Message,
    Webhook,
    signature,
    verify,
)

SECRET = "s3cret-of-the-receiver"
BODY = b'{"event":"job_dead_lettered","job_id":"a"}'
NOW = 1_800_000_000


def signed(body: bytes = BODY, at: int = NOW, secret: str = SECRET) -> dict[str, str]:
    return {TIMESTAMP_HEADER: str(at), SIGNATURE_HEADER: signature(secret, str(at), body)}


def test_a_signed_fresh_notice_verifies_in_any_header_spelling() -> None:
    assert verify(SECRET, signed(), BODY, now=NOW)
    assert verify(SECRET.encode(), signed(), BODY, now=NOW + 299)
    lower = {k.lower(): v for k, v in signed().items()}
    assert verify(SECRET, lower, BODY, now=NOW)
    raw = {k.lower().encode(): v.encode() for k, v in signed().items()}
    assert verify(SECRET, raw, BODY, now=NOW)  # ASGI-style bytes
    assert verify(SECRET, signed(), bytearray(BODY), now=NOW)


@pytest.mark.parametrize("headers, body, secret", [
    (signed(), BODY + b" ", SECRET),                                 # tampered body
    (signed(), BODY, "another-secret"),                              # wrong key
    (signed(), BODY, ""),                                            # no key
    ({TIMESTAMP_HEADER: str(NOW)}, BODY, SECRET),                     # no signature
    ({SIGNATURE_HEADER: signed()[SIGNATURE_HEADER]}, BODY, SECRET),   # no timestamp
    ({}, BODY, SECRET),
    ({**signed(), SIGNATURE_HEADER: "sha256=ü" + "0" * 63}, BODY, SECRET),  # non-ASCII
    ({**signed(), TIMESTAMP_HEADER: "abc"}, BODY, SECRET),
    ({**signed(), TIMESTAMP_HEADER: "1e9"}, BODY, SECRET),
    ({**signed(), TIMESTAMP_HEADER: "-5"}, BODY, SECRET),
    ({**signed(), TIMESTAMP_HEADER: "1800000000 0"}, BODY, SECRET),
    ({**signed(), TIMESTAMP_HEADER: "1_800_000_000"}, BODY, SECRET),
    ({**signed(), TIMESTAMP_HEADER: "\u0661\u0668" + "0" * 8}, BODY, SECRET),  # Arabic digits
    ({**signed(), TIMESTAMP_HEADER: "9" * 5000}, BODY, SECRET),
    (signed(at=NOW - 301), BODY, SECRET),                              # stale: a replay
    (signed(at=NOW + 301), BODY, SECRET),                              # from the future
    ({TIMESTAMP_HEADER: None, SIGNATURE_HEADER: 5}, BODY, SECRET),
    (signed(), "a str body", SECRET),
    (signed(), None, SECRET),
])
def test_every_bad_input_is_false_and_never_an_exception(headers: Any, body: Any,
                                                        secret: str) -> None:
    assert verify(secret, headers, body, now=NOW) is False


def test_the_default_clock_is_this_hosts() -> None:
    now = int(time.time())
    assert verify(SECRET, signed(at=now), BODY)
    assert not verify(SECRET, signed(at=now - 3600), BODY)


@given(headers=st.dictionaries(
           st.one_of(st.sampled_from([TIMESTAMP_HEADER, SIGNATURE_HEADER, "x-zsched-signature"]),
                     st.text(max_size=20), st.binary(max_size=10)),
           st.one_of(st.text(max_size=80), st.binary(max_size=80), st.integers(), st.none()),
           max_size=4),
       body=st.one_of(st.binary(max_size=100), st.text(max_size=20), st.none(), st.integers()),
       secret=st.one_of(st.text(max_size=20), st.binary(max_size=20)))
def test_any_input_gives_a_bool(headers: dict[Any, Any], body: Any, secret: Any) -> None:
    assert verify(secret, headers, body, now=NOW) in (True, False)


# ------------------------------------------------------------------ redirects
class _Hits:
    def __init__(self) -> None:
        self.paths: list[tuple[str, str, dict[str, str]]] = []


@contextmanager
def _server(status: int, location: str = "") -> Iterator[tuple[str, _Hits]]:
    hits = _Hits()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            hits.paths.append((self.command, self.path, dict(self.headers)))
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            self.send_response(status)
            if location:
                self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_the_webhook_follows_no_redirect_and_does_not_retry_one(status: int) -> None:
    with _server(200) as (elsewhere, other), \
            _server(status, f"{elsewhere}/stolen") as (url, hook):
        webhook = Webhook(url + "/hook", secret=SECRET, timeout_s=5, retries=3, backoff_s=0.01)
        with pytest.raises(DeliveryFailed, match=str(status)):
            webhook.send(Message("job_dead_lettered", {"job_id": "a"}))
    assert len(hook.paths) == 1  # one attempt: a redirect is not retried
    assert other.paths == []     # and never followed, with or without the headers
