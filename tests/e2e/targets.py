"""Scrape targets on loopback addresses of their own: each one a domain.

Every 127.x address reaches this machine, so a target on 127.0.0.2 and one on
127.0.0.3 are two domains to the scheduler (a job's domain is its URL's host).
A :class:`PacedTarget` holds every request a while, so requests overlap, and
records each arrival: when (``time.time()``, the clock Redis' ``TIME`` reads
on this machine), how many were in flight there then, which task and which
worker sent it, and when it was answered.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from e2e.names import TASK_ID_PARAM, WORKER_ID_PARAM

#: An answer: status and headers.
Answer = tuple[int, dict[str, str]]


def _ok(_index: int) -> Answer:
    return 200, {}


# ------------------------------------------------------------------- targets
@dataclass
class Arrival:
    """One request at a target."""

    index: int  # 0-based, in arrival order
    at: float  # time.time() on arrival
    in_flight: int  # requests in flight at the target, this one included
    status: int  # what it was answered
    task_id: str  # the Celery task id the scrape task sent along
    worker: str  # the name of the worker that ran it
    answered: float | None = None  # time.time() once the answer was written


class PacedTarget(ThreadingHTTPServer):
    """A scrape target on ``host`` that holds every request ``hold_s`` and records it.

    ``answer(index)`` chooses the status and headers of the ``index``-th
    request (0-based, arrival order); 200 by default.
    """

    daemon_threads = True

    def __init__(self, host: str, hold_s: float, answer: Callable[[int], Answer] = _ok) -> None:
        super().__init__((host, 0), _PacedHandler)
        self.host = host
        self.hold_s = hold_s
        self.answer = answer
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._arrivals: list[Arrival] = []
        self._in_flight = 0

    def url(self, path: str) -> str:
        """Absolute URL of ``path`` on this target."""
        return f"http://{self.host}:{self.server_address[1]}{path}"

    def arrive(self, task_id: str, worker: str) -> Arrival:
        with self._lock:
            self._in_flight += 1
            index = len(self._arrivals)
            status = self.answer(index)[0]
            arrival = Arrival(index, time.time(), self._in_flight, status, task_id, worker)
            self._arrivals.append(arrival)
            return arrival

    def leave(self, arrival: Arrival) -> None:
        with self._lock:
            self._in_flight -= 1
            arrival.answered = time.time()

    def arrivals(self) -> list[Arrival]:
        """Every request so far, in arrival order."""
        with self._lock:
            return list(self._arrivals)

    def workers(self) -> set[str]:
        """Names of the workers whose requests arrived."""
        with self._lock:
            return {a.worker for a in self._arrivals}

    def count(self) -> int:
        with self._lock:
            return len(self._arrivals)


class _PacedHandler(BaseHTTPRequestHandler):
    server: PacedTarget
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        query = dict(parse_qsl(urlsplit(self.path).query))
        arrival = self.server.arrive(query.get(TASK_ID_PARAM, ""),
                                     query.get(WORKER_ID_PARAM, ""))
        status, headers = self.server.answer(arrival.index)
        # Held so that requests overlap and in-flight counts are observable.
        self.server.stopping.wait(self.server.hold_s)
        body = f"{status}\n".encode()
        with contextlib.suppress(OSError):  # the worker may be gone (teardown)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
        # After the answer is out: in flight means "not answered yet".
        self.server.leave(arrival)

    def log_message(self, format: str, *args: Any) -> None:
        pass


#: Loopback addresses handed out to targets; every 127.x reaches this machine.
_HOSTS = (f"127.0.0.{n}" for n in itertools.count(2))


def serve_targets() -> Iterator[Callable[..., PacedTarget]]:
    """``targets(hold_s, answer=...)``: a :class:`PacedTarget` on a loopback address
    of its own (a domain of its own), served in a thread; all stopped in teardown."""
    made: list[tuple[PacedTarget, threading.Thread]] = []

    def make(hold_s: float, answer: Callable[[int], Answer] = _ok) -> PacedTarget:
        server = PacedTarget(next(_HOSTS), hold_s, answer)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                  name=f"target-{server.host}", daemon=True)
        thread.start()
        made.append((server, thread))
        return server

    try:
        yield make
    finally:
        for server, thread in made:
            server.stopping.set()
            server.shutdown()
            server.server_close()
            thread.join(5)


