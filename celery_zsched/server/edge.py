"""The server's edge: what a client may hold (connections, time) before it is let go.

uvicorn alone takes any number of connections and waits for a request's headers
forever: idle sockets opened by anyone who can reach the port exhaust the fds,
and accept() then fails for everyone (EMFILE). uvicorn's ``limit_concurrency``
does not help (it answers 503 to requests, but keeps the connections), nor does
its keep-alive timeout (it runs only after a first answer, and any byte stops it).
So the HTTP protocol here is uvicorn's (h11's, or httptools' when it is installed:
the ``standard`` extra; see :func:`guarded_protocol`) with five additions:

- **a connection cap** (``zsched_http_max_connections``; by default the soft fd
  limit minus :data:`FD_RESERVE`): a connection past it closes the *oldest idle*
  one (no request in progress: waiting for headers, or kept alive), so a flood
  of idle or slow sockets cannot keep a real client out; with no idle one to
  close, the newcomer gets ``503`` and is closed;
- **a header timeout** (``zsched_http_header_timeout_s``): from the connection's
  opening, or the end of its previous answer, to the end of a request's headers,
  however slowly its bytes trickle in (slowloris);
- **a body timeout** (``zsched_http_body_timeout_s``): the longest pause between
  two reads of a request body (not counted while the app is the one not reading);
- a request head (request line and headers) of at most :data:`MAX_HEAD_BYTES`,
  as h11 has on its own and httptools has not;
- a listen backlog of :data:`BACKLOG`, which bounds how many sockets one event
  loop tick accepts before the cap can close the extra ones.

:class:`BodyGuard`, an ASGI middleware, closes the connection after any answer
sent before the request's body was read to its end (``401``, ``403``, ``413``,
``400``): uvicorn would otherwise read and discard the rest of the body to keep the
connection alive, for as long as the client sends it. It also refuses a path with
a ``.`` or ``..`` segment: clients and proxies rewrite them, so they never name a job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from celery_zsched.config import SETTING_PREFIX, Settings
from celery_zsched.server.problems import PROBLEM_JSON

logger = logging.getLogger("celery_zsched.server")

#: Pending connections the kernel queues for accept(); asyncio accepts up to this
#: many per loop tick before any of their protocols runs.
BACKLOG = 32
#: Fds kept free of HTTP connections: the store's Redis connections (one per store
#: thread, the wake-up subscription), the listening socket, logs, and the sockets
#: accepted in a burst (up to two ticks of :data:`BACKLOG`) before the cap closes them.
FD_RESERVE = 64 + 4 * BACKLOG
#: Largest automatic connection cap, whatever the fd limit.
MAX_AUTO_CONNECTIONS = 4096
#: Fewest connections the server runs with (an fd limit too low for the reserve).
MIN_CONNECTIONS = 16
#: Largest request head (request line and headers): h11's own limit, which
#: httptools lacks, so the guard keeps it on either parser.
MAX_HEAD_BYTES = 16 * 1024

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class Limits:
    """What one server allows each client (resolved from the settings)."""

    max_connections: int
    max_polls: int
    header_timeout_s: float
    body_timeout_s: float
    keepalive_s: float


def soft_fd_limit() -> int:
    """This process's soft limit of open files (``ulimit -n``)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def limits_for(settings: Settings, fd_limit: int | None = None) -> Limits:
    """The limits of ``settings``: a cap of 0 is the fd limit minus the reserve, and a
    cap set above what the fd limit allows is lowered to it (and logged)."""
    fds = soft_fd_limit() if fd_limit is None else fd_limit
    room = max(MIN_CONNECTIONS, fds - FD_RESERVE)
    cap = settings.http_max_connections or min(room, MAX_AUTO_CONNECTIONS)
    if cap > room:
        logger.warning("zsched serve: %shttp_max_connections=%d is more than the fd limit "
                       "(%d) leaves room for; using %d (raise ulimit -n)",
                       SETTING_PREFIX, cap, fds, room)
        cap = room
    polls = settings.gateway_max_polls or max(1, cap // 2)
    return Limits(max_connections=cap, max_polls=min(polls, cap),
                  header_timeout_s=settings.http_header_timeout_s,
                  body_timeout_s=settings.http_body_timeout_s,
                  keepalive_s=settings.http_keepalive_s)


_REFUSED = json.dumps({"type": "about:blank", "title": "too many connections", "status": 503,
                       "detail": "the server holds as many connections as it may; retry"}
                      ).encode()
#: The answer of a connection past the cap when no idle one can make room.
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
            b"Content-Type: " + PROBLEM_JSON.encode() + b"\r\nContent-Length: "
            + str(len(_REFUSED)).encode() + b"\r\n\r\n" + _REFUSED)


# Both of uvicorn's protocols keep a request's state in the same attributes (cycle,
# flow, connections, transport, loop): one guard serves either. Type-checked
# against the h11 one.
if TYPE_CHECKING:
    _Protocol = H11Protocol
else:
    _Protocol = object


_HEAD_TOO_LARGE = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                   b"Connection: close\r\nContent-Length: 30\r\n\r\n"
                   b"Invalid HTTP request received.")


class GuardedProtocol(_Protocol):
    """A connection cap, and header and body timeouts, for one of uvicorn's protocols.

    A subclass per server (:func:`guarded_protocol`) holds its limits and its idle
    connections, oldest first.
    """

    limits: ClassVar[Limits]
    idle: ClassVar[OrderedDict[GuardedProtocol, None]]
    #: Connections closed by the cap or a timeout (for logs and tests).
    evicted: ClassVar[dict[str, int]]
    #: The HTTP parser underneath: ``h11`` or ``httptools``.
    parser: ClassVar[str]

    _timer: asyncio.TimerHandle | None = None
    _phase = "head"
    _seen: object = None
    #: Bytes received since the current request head began.
    _head_bytes = 0

    # ------------------------------------------------------------- events
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._enter("head")
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            self._count("refused")
            transport.write(_REFUSAL)
            transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track(data_arrived=True)
        if self._phase == "head" and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                # The answer h11 gives past its limit, then no more reading.
                self._count("head too large")
                self.idle.pop(self, None)
                self._cancel()
                self.transport.write(_HEAD_TOO_LARGE)
                self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track(data_arrived=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        self.idle.pop(self, None)
        super().connection_lost(exc)

    # -------------------------------------------------------------- state
    def _track(self, *, data_arrived: bool) -> None:
        """Follow the request cycle: waiting for headers, reading a body, or busy."""
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            phase = "head"
        elif cycle.more_body:
            phase = "body"
        else:
            phase = "busy"
        if cycle is not self._seen or phase != self._phase:
            self._seen = cycle
            self._enter(phase)
        elif phase == "body" and data_arrived:
            self._arm(self.limits.body_timeout_s)  # a pause, not the whole body, is timed

    def _enter(self, phase: str) -> None:
        self._phase = phase
        self._head_bytes = 0
        if phase == "head":
            # The newest idle connection goes last: eviction takes the oldest first.
            self.idle.pop(self, None)
            self.idle[self] = None
            self._arm(self.limits.header_timeout_s)
        else:
            self.idle.pop(self, None)
            if phase == "body":
                self._arm(self.limits.body_timeout_s)
            else:
                self._cancel()

    def _arm(self, seconds: float) -> None:
        self._cancel()
        self._timer = self.loop.call_later(seconds, self._timed_out, self._phase)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self, phase: str) -> None:
        self._timer = None
        if self._phase != phase or self.transport.is_closing():
            return
        if phase == "body" and self.flow.read_paused:
            # The app has not taken what came: the client is not the slow one.
            self._arm(self.limits.body_timeout_s)
            return
        self._count(f"{phase} timeout")
        self.idle.pop(self, None)
        self.transport.abort()

    def _make_room(self) -> bool:
        """Close the oldest idle connection but this one; ``False`` if there is none."""
        for other in self.idle:
            if other is not self:
                self.idle.pop(other)
                self._count("evicted")
                other._cancel()
                other.transport.abort()
                return True
        return False

    def _count(self, what: str) -> None:
        self.evicted[what] = self.evicted.get(what, 0) + 1


def http_parsers() -> tuple[str, ...]:
    """The HTTP parsers this process can serve with, the fastest first."""
    try:
        import httptools  # noqa: F401  (the standard extra)
    except ImportError:
        return ("h11",)
    return ("httptools", "h11")


def guarded_protocol(limits: Limits, http: str = "auto") -> type[GuardedProtocol]:
    """A protocol class for one server: its limits, its own idle connections and counts.

    ``http``: uvicorn's protocol to guard, ``h11`` or ``httptools`` (``auto``: the
    fastest installed, :func:`http_parsers`).
    """
    parser = http_parsers()[0] if http == "auto" else http
    if parser not in http_parsers():
        raise ValueError(f"http parser {http!r} is not installed (choose from "
                         f"{', '.join(http_parsers())})")
    base: type[Any] = H11Protocol
    if parser == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        base = HttpToolsProtocol
    return type("ZschedHTTPProtocol", (GuardedProtocol, base),
                {"limits": limits, "idle": OrderedDict(), "evicted": {}, "parser": parser})


# ----------------------------------------------------------------- ASGI
def _dot_segment(path: str) -> bool:
    return any(segment in (".", "..") for segment in path.split("/"))


def _problem(status: int, title: str, detail: str) -> tuple[dict[str, Any], bytes]:
    body = json.dumps({"type": "about:blank", "title": title, "status": status,
                       "detail": detail, "field": "path"}).encode()
    start = {"type": "http.response.start", "status": status,
             "headers": [(b"content-type", PROBLEM_JSON.encode()),
                         (b"content-length", str(len(body)).encode())]}
    return start, body


class BodyGuard:
    """ASGI middleware: ``Connection: close`` on an answer that leaves a body unread, and
    ``400`` for a path with ``.`` or ``..`` segments (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"0")
        unread = b"transfer-encoding" in headers or (length.strip() not in (b"", b"0"))

        async def receive_and_note() -> Message:
            nonlocal unread
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                unread = False
            return message

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start" and unread:
                # Stop here rather than read (and discard) whatever the client sends.
                kept = [(k, v) for k, v in message.get("headers", ())
                        if k.lower() != b"connection"]
                message = {**message, "headers": [*kept, (b"connection", b"close")]}
            await send(message)

        if _dot_segment(scope["path"]):
            start, body = _problem(400, "invalid request",
                                   "path: a . or .. segment never names a job: clients and "
                                   "proxies rewrite them (percent-encode a / of an id as %2F)")
            await send_closing(start)
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive_and_note, send_closing)
