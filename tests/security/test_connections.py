"""Hostile connections against a real ``zsched serve`` with an fd limit of its own.

Idle sockets and slowloris clients, twice as many as the server's fd limit, neither
make accept() fail (EMFILE) nor keep a real client out: the connection cap closes
the oldest idle connection for each newcomer, the header timeout closes the rest,
and the server's fds come back to what they were. Every bound is the default's.

"Served" is checked structurally: the real client's request gets its answer while
the flood holds every connection it can, and the only time limit is the client's
generous timeout, which a loaded CI machine cannot turn red by accident.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from celery_zsched.config import Settings
from celery_zsched.server.edge import FD_RESERVE
from security.conftest import Server
from tests.gateway.conftest import READER, WORKER, WRITER, output_so_far
from tests.helpers import wait

pytestmark = pytest.mark.slow

#: The server's fd limit: room for FD_RESERVE and a cap of 80 connections.
FD_LIMIT = FD_RESERVE + 80
#: Hostile connections: twice the fd limit.
FLOOD = 2 * FD_LIMIT
#: A timeout that tells "served" from "not served" on a loaded machine.
SERVED_WITHIN_S = 15.0
#: The default header timeout, plus slack, for the fds to come back.
BACK_WITHIN_S = Settings().http_header_timeout_s * 4 + 30


@pytest.fixture(autouse=True)
def _room_for_the_flood() -> None:
    # The flood's sockets are this process's fds: make sure it may open them.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < FLOOD + 200:
        if hard != resource.RLIM_INFINITY and hard < FLOOD + 200:
            pytest.skip(f"this process may open {hard} files, the flood needs {FLOOD + 200}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (FLOOD + 200, hard))


@contextlib.contextmanager
def flood(server: Server, opening: bytes = b"",
          trickle: bytes = b"") -> Iterator[list[socket.socket]]:
    """``FLOOD`` connections that send ``opening``, then ``trickle`` every second; all
    closed at the end."""
    sockets: list[socket.socket] = []
    stop = threading.Event()

    def keep_trickling() -> None:
        while not stop.wait(1.0):
            for sock in list(sockets):
                with contextlib.suppress(OSError):
                    sock.send(trickle)

    try:
        for _ in range(FLOOD):
            sock = socket.socket()
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.connect(("127.0.0.1", server.port))
            sockets.append(sock)
        if opening:
            time.sleep(0.5)
            for sock in sockets:
                with contextlib.suppress(OSError):
                    sock.send(opening)
        thread = threading.Thread(target=keep_trickling, daemon=True)
        if trickle:
            thread.start()
        yield sockets
    finally:
        stop.set()
        for sock in sockets:
            sock.close()


def _served_during(server: Server, sockets: list[socket.socket]) -> None:
    baseline = server.fds()
    peak = baseline
    with server.client(WRITER, timeout=SERVED_WITHIN_S) as client:
        for n in range(5):  # a real client, while the flood holds its connections
            peak = max(peak, server.fds())
            answer = client.get("/v1/jobs", params={"limit": 1},
                                headers={"Connection": "close"} if n % 2 else {})
            assert answer.status_code == 200, answer.text
            time.sleep(0.2)
    assert peak <= FD_LIMIT
    assert "out of system resource" not in output_so_far(server.proc), "accept() hit EMFILE"


def _fds_come_back(server: Server, baseline: int) -> None:
    # The flood's sockets stay open on the client's side: only the server's timeouts
    # and cap can have closed them.
    wait(lambda: server.fds() <= baseline + 2, BACK_WITHIN_S,
         f"the server's fds to come back to {baseline}", interval=0.5)


def _baseline(server: Server) -> int:
    with server.client(WRITER) as client:
        assert client.get("/v1/jobs").status_code == 200
    time.sleep(0.5)
    return server.fds()


def test_idle_connections_twice_the_fd_limit_neither_exhaust_fds_nor_keep_a_client_out(
        serve_process: Callable[..., Server]) -> None:
    server = serve_process(fd_limit=FD_LIMIT)
    baseline = _baseline(server)
    with flood(server) as sockets:
        time.sleep(1.0)
        _served_during(server, sockets)
        _fds_come_back(server, baseline)
        # The first idle socket was closed by the server (evicted, or timed out).
        first = sockets[0]
        first.setblocking(True)
        first.settimeout(5)
        try:
            ended = first.recv(1024)
        except ConnectionResetError:
            ended = b""
        assert ended == b"" or ended.startswith(b"HTTP/1.1 503"), ended[:100]


def test_slowloris_twice_the_fd_limit_is_cut_by_the_header_timeout(
        serve_process: Callable[..., Server]) -> None:
    server = serve_process(fd_limit=FD_LIMIT)
    baseline = _baseline(server)
    opening = b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n"
    with flood(server, opening=opening, trickle=b"X") as sockets:
        time.sleep(1.0)
        _served_during(server, sockets)
        _fds_come_back(server, baseline)


def test_long_polls_past_their_bound_get_503_with_retry_after(
        serve_process: Callable[..., Server]) -> None:
    server = serve_process(fd_limit=FD_LIMIT)
    bound, extra = 80 // 2, 5  # the default bound: half the connection cap (80)
    answers: list[httpx.Response] = []

    def poll() -> None:
        with server.client(WORKER, timeout=60) as client:
            answers.append(client.get("/jobs/next", params={"timeout": 8}))

    threads = [threading.Thread(target=poll) for _ in range(bound + extra)]
    for thread in threads:
        thread.start()
    wait(lambda: len(answers) >= extra, 20, "the polls past the bound to be refused")
    with server.client(WRITER) as client:
        # While the bound is full, every other request still has a connection.
        assert client.get("/v1/jobs", params={"limit": 1}).status_code == 200
    for thread in threads:
        thread.join(60)
    refused = [a for a in answers if a.status_code == 503]
    assert len(refused) == extra and len(answers) == bound + extra
    assert all(a.status_code == 204 for a in answers if a not in refused)
    for answer in refused:
        assert int(answer.headers["retry-after"]) >= 1
        assert answer.json()["title"] == "too many polls"


def _send_chunked(sock: socket.socket, head: bytes, total: int) -> tuple[int, bytes]:
    """Send ``head``, then a chunked body of up to ``total`` bytes until the server
    closes; the bytes it took and what it answered."""
    sock.sendall(head)
    chunk = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
    sent = 0
    sock.settimeout(10)
    try:
        while sent < total:
            sock.sendall(chunk)
            sent += 0x10000
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass
    answer = b""
    with contextlib.suppress(OSError):
        while part := sock.recv(65536):
            answer += part
    return sent, answer


@pytest.mark.parametrize("token, status", [(None, b"401"), (READER, b"403"), (WRITER, b"413")])
def test_a_chunked_body_past_the_limit_or_the_token_is_cut_and_the_connection_closed(
        serve_process: Callable[..., Server], token: str | None, status: bytes) -> None:
    server = serve_process()
    auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
    head = (b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n" + auth + b"\r\n")
    total = 50 * 1024 * 1024
    with server.connect() as sock:
        sent, answer = _send_chunked(sock, head, total)
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
    assert b"connection: close" in answer.lower()
    # The server stopped reading: what got through is the limit (256 KiB) plus what
    # the kernels' socket buffers hold, nowhere near the 50 MiB offered.
    assert sent < total // 4, sent
