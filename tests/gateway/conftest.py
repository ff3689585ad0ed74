"""A real job gateway (uvicorn on a free port) on the throwaway Redis, and clients for it.

The fast tests run the server in a thread of the test process: a real HTTP
server, real sockets, the real dispatcher and store, started in about 50 ms.
The tests that need a server process of its own (``zsched serve``: signals,
the Node.js worker) start one with :func:`serve_process`.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from celery_zsched.config import Settings
from celery_zsched.core.job import Job
from celery_zsched.server.app import create_app
from celery_zsched.server.dispatcher import Dispatcher
from celery_zsched.server.runner import server_config
from celery_zsched.services.writer import JobWriter
from celery_zsched.store import Store
from tests.helpers import free_port, wait

WORKER = "worker-token-0123456789"
READER = "reader-token-0123456789"
WRITER = "writer-token-0123456789"
TOKENS = f"{WORKER}:worker,{READER}:read,{WRITER}:write"
#: zsched_gateway_lease_secret of every test server (required with a worker token).
LEASE_SECRET = "test-lease-secret-0123456789abcdefghij"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Served:
    """A gateway serving ``store`` at ``url``."""

    store: Store
    url: str
    server: uvicorn.Server
    thread: threading.Thread
    dispatcher: Dispatcher

    def client(self, token: str | None = WORKER, timeout: float = 10.0) -> httpx.Client:
        """An HTTP client with ``token`` as its bearer token (``None``: no header)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def stop(self) -> None:
        """Shut down as on SIGTERM: polls get 503, then the server stops."""
        self.dispatcher.begin_shutdown_threadsafe()
        self.server.should_exit = True
        self.thread.join(15)


def http_job(job_id: str, **fields: Any) -> Job:
    """An HTTP job (no jitter: tests time it)."""
    timing = {} if {"run_at", "cron", "interval_s"} & set(fields) else {"interval_s": 60}
    data = {"id": job_id, "url": f"http://target.invalid/{job_id}", "transport": "http",
            "jitter_s": 0, **timing, **fields}
    return Job.from_dict(data)


@pytest.fixture
def serve(make_store: Callable[..., Store]) -> Iterator[Callable[..., Served]]:
    """Start a gateway with setting overrides; every one started is stopped after the test."""
    started: list[Served] = []

    def start(redis_url: str | None = None, *, store: Store | None = None,
              writer: JobWriter | None = None, http: str = "auto", **overrides: Any) -> Served:
        """``store`` given: served as it is (its settings hold the tokens); ``writer``
        takes the management API's changes (default: the store); ``http``: the parser
        (``zsched serve --http``)."""
        values = {"api_tokens": TOKENS, "gateway_lease_secret": LEASE_SECRET,
                  "gateway_timeout_s": 2.0, "gateway_lease_s": 30.0, "max_jitter_s": 0.0,
                  **overrides}
        if store is None:
            store = (Store.from_settings(Settings(redis_url=redis_url, **values)) if redis_url
                     else make_store(**values))
        app = create_app(store, writer=writer)
        port = free_port()
        # The server's own configuration (its guarded protocol), as zsched serve's.
        config = server_config(app, "127.0.0.1", port, log_level="warning", http=http,
                               timeout_graceful_shutdown=5)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        wait(lambda: server.started, 10, "the gateway to start", interval=0.01)
        served = Served(store, f"http://127.0.0.1:{port}", server, thread,
                        app.state.gateway.dispatcher)
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


#: Output of each serve process (by pid), read as it comes: a pipe nobody reads
#: fills at 64 KiB, and the server then blocks on its next log line (a soak
#: run's job_error warnings hung it).
_OUTPUT: dict[int, tuple[threading.Thread, list[str]]] = {}


def _drain(proc: subprocess.Popen[str]) -> None:
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    _OUTPUT[proc.pid] = (thread, lines)


def _output(proc: subprocess.Popen[str]) -> str:
    thread, lines = _OUTPUT[proc.pid]
    thread.join(5)
    return "".join(lines)


def serve_process(redis_url: str, prefix: str, port: int, log_level: str = "warning",
                  *, django_settings: str | None = None, args: Sequence[str] = (),
                  fd_limit: int | None = None, **settings: Any) -> subprocess.Popen[str]:
    """``celery -A tests.cli_app zsched serve`` in a process of its own; waits until it answers.

    Without Django unless ``django_settings`` names a settings module: pytest-django
    exports the test suite's, which would make the server write Django models.
    ``fd_limit``: the process's RLIMIT_NOFILE (soft and hard), as ``ulimit -n`` sets it.
    """
    env = {**os.environ, "ZSCHED_REDIS_URL": redis_url, "ZSCHED_KEY_PREFIX": prefix,
           "ZSCHED_API_TOKENS": TOKENS, "ZSCHED_GATEWAY_LEASE_SECRET": LEASE_SECRET,
           "ZSCHED_MAX_JITTER_S": "0"}
    env.update({f"ZSCHED_{name.upper()}": str(value) for name, value in settings.items()})
    env.pop("DJANGO_SETTINGS_MODULE", None)
    if django_settings:
        env["DJANGO_SETTINGS_MODULE"] = django_settings

    def limit_fds() -> None:
        if fd_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.cli_app", "zsched", "serve",
         "--port", str(port), "--log-level", log_level, *args],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=limit_fds if fd_limit is not None else None)
    _drain(proc)

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"zsched serve exited: {_output(proc)}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/jobs/next", timeout=1)
        except httpx.HTTPError:
            return False
        return True

    # Start-up only: a loaded machine can take long to import; an exit fails at once.
    try:
        wait(answers, 120, "zsched serve to answer", interval=0.1)
    except BaseException:
        proc.kill()  # the caller never gets it to stop: it must not outlive the test
        proc.wait(10)
        raise
    return proc


def output_so_far(proc: subprocess.Popen[str]) -> str:
    """What a serve process has printed so far (it keeps running)."""
    return "".join(_OUTPUT[proc.pid][1])


def stop_process(proc: subprocess.Popen[str], timeout: float = 15) -> str:
    """SIGTERM, then wait; the process's output."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return _output(proc)


def elapsed(start: float) -> float:
    """Seconds since ``start`` (a ``time.monotonic()``)."""
    return time.monotonic() - start
