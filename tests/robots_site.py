"""A local site that serves a robots.txt (and pages), counting every request.

Each site listens on a loopback address of its own (127.0.1.x here; the e2e
targets take 127.0.0.x), so each is an origin and a domain of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

#: An answer to a path: status, headers, body.
Reply = tuple[int, dict[str, str], bytes]
#: Path -> its answer, or a function of the request number of that path.
Routes = dict[str, Reply | Callable[[int], Reply]]
_HOSTS = (f"127.0.1.{n}" for n in itertools.cycle(range(2, 250)))


class Site(ThreadingHTTPServer):
    """``routes``: path -> answer (or a function of the request number of that path)."""

    daemon_threads = True

    def __init__(self, host: str, routes: Routes) -> None:
        super().__init__((host, 0), _Handler)
        self.host = host
        self.routes = routes
        self.hits: Counter[str] = Counter()
        #: (path, time.time() of arrival) of every request, in order.
        self.log: list[tuple[str, float]] = []
        self.lock = threading.Lock()
        #: Seconds to pause between body chunks (a slow robots.txt).
        self.trickle_s = 0.0
        self.stopping = threading.Event()

    @property
    def origin(self) -> str:
        return f"http://{self.host}:{self.server_address[1]}"

    def url(self, path: str) -> str:
        return self.origin + path

    def count(self, path: str = "/robots.txt") -> int:
        with self.lock:
            return self.hits[path]

    def times(self, prefix: str) -> list[float]:
        """Arrival times of the requests whose path starts with ``prefix``."""
        with self.lock:
            return [at for path, at in self.log if path.startswith(prefix)]


class _Handler(BaseHTTPRequestHandler):
    server: Site
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        with self.server.lock:
            self.server.hits[path] += 1
            self.server.log.append((path, time.time()))
            number = self.server.hits[path]
        route = self.server.routes.get(path, (200, {}, b"page\n"))
        status, headers, body = route(number) if callable(route) else route
        with contextlib.suppress(OSError):
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.server.trickle_s:
                for i in range(0, len(body), 16):
                    self.wfile.write(body[i:i + 16])
                    self.wfile.flush()
                    self.server.stopping.wait(self.server.trickle_s)
            else:
                self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_sites() -> Iterator[Callable[..., Site]]:
    """``sites(routes)``: a :class:`Site` on an address of its own; stopped in teardown."""
    made: list[tuple[Site, threading.Thread]] = []

    def make(routes: Routes) -> Site:
        site = Site(next(_HOSTS), routes)
        thread = threading.Thread(target=site.serve_forever, kwargs={"poll_interval": 0.05},
                                  daemon=True)
        thread.start()
        made.append((site, thread))
        return site

    try:
        yield make
    finally:
        for site, thread in made:
            site.stopping.set()
            site.shutdown()
            site.server_close()
            thread.join(5)
