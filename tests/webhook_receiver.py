"""A local HTTP receiver of notification webhooks that checks their HMAC signature."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from celery_zsched.notify import verify as notify_verify

#: A receiver refuses requests whose timestamp is further off than this.
TOLERANCE_S = 300


@dataclass
class Post:
    """One request the receiver got."""

    event: str
    body: dict[str, Any]
    #: The signature matched the body and timestamp, and the timestamp is fresh.
    verified: bool
    #: The status the receiver answered with.
    status: int
    headers: dict[str, str] = field(default_factory=dict)


def verify(secret: str, headers: dict[str, str], raw: bytes) -> bool:
    """What a receiver does: the package's own :func:`celery_zsched.notify.verify`."""
    return notify_verify(secret, headers, raw, tolerance_s=TOLERANCE_S)


class Receiver:
    """Records every POST; can answer 500 to the first ones, or hang."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.posts: list[Post] = []
        #: Answer 500 to this many requests first.
        self.fail_first = 0
        #: Then answer with this status.
        self.status = 200
        #: Hold each request this long (until :attr:`release` is set) before answering.
        self.hang_s = 0.0
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """Where to POST."""
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/hook"

    def record(self, headers: dict[str, str], raw: bytes) -> int:
        with self.lock:
            status = 500 if len(self.posts) < self.fail_first else self.status
            self.posts.append(Post(headers.get("X-Zsched-Event", ""), json.loads(raw),
                                   verify(self.secret, headers, raw), status, headers))
        return status

    def of(self, event: str) -> list[Post]:
        """The posts of one event (``digest`` for digests)."""
        with self.lock:
            return [p for p in self.posts if p.event == event]

    def wait(self, count: int, timeout: float = 10.0) -> list[Post]:
        """Wait until at least ``count`` posts arrived; all of them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.posts) >= count:
                    return list(self.posts)
            time.sleep(0.02)
        with self.lock:
            raise AssertionError(f"{len(self.posts)} posts arrived, expected {count}")


class _Handler(BaseHTTPRequestHandler):
    server: Any

    def do_POST(self) -> None:
        receiver: Receiver = self.server.receiver
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status = receiver.record(dict(self.headers.items()), raw)
        if receiver.hang_s:
            receiver.release.wait(receiver.hang_s)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def running_receiver(secret: str = "s3cret") -> Iterator[Receiver]:
    """A :class:`Receiver` on a free port of 127.0.0.1, stopped on exit."""
    receiver = Receiver(secret)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.receiver = receiver  # type: ignore[attr-defined]
    receiver.server = server
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.release.set()
        server.shutdown()
        server.server_close()
