"""The status and Retry-After a task's exception carries reach the settle."""

from __future__ import annotations

import email.utils
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from celery_zsched.core.errors import JobFailed
from celery_zsched.core.http_status import parse_retry_after, retry_after_of, status_of


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, retry_after = {"/429": (429, "7"), "/503": (503, None)}.get(
            self.path, (200, None))
        self.send_response(status)
        if retry_after:
            self.send_header("Retry-After", retry_after)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.2", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.2:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _error(url: str) -> urllib.error.HTTPError:
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url, timeout=5)
    return err.value


def test_urllib_errors_carry_their_status_and_retry_after(server: str) -> None:
    too_many = _error(server + "/429")
    assert (status_of(too_many), retry_after_of(too_many)) == (429, 7.0)
    unavailable = _error(server + "/503")
    assert (status_of(unavailable), retry_after_of(unavailable)) == (503, None)


def test_job_failed_and_response_shaped_errors() -> None:
    failed = JobFailed("HTTP 429", status=429, retry_after=12)
    assert (status_of(failed), retry_after_of(failed)) == (429, 12.0)

    class Response:
        status_code = 503
        headers: ClassVar[dict[str, str]] = {"retry-after": "30"}

    class ClientError(Exception):
        response = Response()

    assert (status_of(ClientError()), retry_after_of(ClientError())) == (503, 30.0)
    assert status_of(ValueError("no status")) is None
    # An errno-style ``code`` is not an HTTP status.
    assert status_of(OSError(2, "gone")) is None


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = time.time()
    assert parse_retry_after("120") == 120.0
    date = email.utils.formatdate(now + 60, usegmt=True)
    assert 58 <= (parse_retry_after(date, now) or 0) <= 61
    assert parse_retry_after(email.utils.formatdate(now - 60, usegmt=True), now) == 0.0
    assert parse_retry_after("soon") is None
