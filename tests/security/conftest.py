"""A real ``zsched serve`` process on the throwaway Redis, and hostile clients for it.

Each server runs with the settings' defaults (timeouts included: a test that
shortened them would prove nothing about them) under a key prefix of its own;
a test may give it an fd limit (RLIMIT_NOFILE, as ``ulimit -n`` sets it).
"""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from tests.gateway.conftest import READER, stop_process
from tests.gateway.conftest import serve as serve
from tests.gateway.conftest import serve_process as start_serve
from tests.helpers import free_port


@dataclass
class Server:
    """One ``zsched serve`` process at ``url``."""

    proc: subprocess.Popen[str]
    port: int
    prefix: str
    output: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Its base URL."""
        return f"http://127.0.0.1:{self.port}"

    def fds(self) -> int:
        """The process's open file descriptors now."""
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def client(self, token: str | None = READER, timeout: float = 10.0) -> httpx.Client:
        """An HTTP client with ``token`` (``None``: no Authorization header)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def connect(self) -> socket.socket:
        """A raw TCP connection to it."""
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)


@pytest.fixture
def serve_process(redis_url: str) -> Iterator[Callable[..., Server]]:
    """Start ``zsched serve`` processes (``fd_limit=`` and setting overrides); each one
    is stopped after the test, and its output kept on :attr:`Server.output`."""
    started: list[Server] = []

    def start(fd_limit: int | None = None, **settings: object) -> Server:
        prefix = "{sec" + uuid.uuid4().hex[:8] + "}:"
        port = free_port()
        proc = start_serve(redis_url, prefix, port, fd_limit=fd_limit, **settings)
        server = Server(proc, port, prefix)
        started.append(server)
        return server

    yield start
    for server in started:
        server.output.append(stop_process(server.proc))
