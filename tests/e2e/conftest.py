"""Fixtures of the end-to-end tests: real beat and worker processes, a local HTTP target.

Each test gets its own deployment: a unique zsched key prefix on the throwaway
redis-server of ``tests/conftest.py``, a broker database of its own on that
server, a unique queue, and the processes it starts. Processes run this
interpreter's ``celery`` with the app :mod:`tests.e2e.e2e_app`, log to files
under ``tmp_path`` (attached to the report of a failing test), and are always
stopped in teardown, with a check that none is left behind.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

import kombu
import psutil
import pytest
import redis

from celery_zsched.config import Settings
from celery_zsched.core.job import Job
from celery_zsched.store import JobInfo, Store
from e2e.names import (
    APP_MODULE,
    ENV_BEAT_SCHEDULE,
    ENV_BROKER_URL,
    ENV_QUEUE,
    ENV_WORKER_ID,
    SCRAPE_TASK,
    TASK_ID_PARAM,
    WORKER_ID_PARAM,
)
from e2e.targets import PacedTarget, serve_targets
from tests.helpers import free_port

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).parent / "celery")
#: How long a process gets to exit on SIGTERM before it is killed.
STOP_GRACE_S = 5.0
#: Broker databases 1..7 of the throwaway server (pytest-redis starts 8; the
#: zsched stores use db 0 under per-test key prefixes).
_BROKER_DBS = itertools.cycle(range(1, 8))
_LOGS = pytest.StashKey[list[Path]]()
#: Inherited variables that would leak settings into the processes (pytest-django exports
#: the suite's Django settings, which would make zsched serve write Django models).
_FOREIGN_ENV = ("ZSCHED_", "CELERY_", "E2E_", "DJANGO_SETTINGS_MODULE")


# --------------------------------------------------------------------- helpers
def wait_for(predicate: Callable[[], T | None], timeout: float, what: str,
             interval: float = 0.05, check: Callable[[], None] | None = None) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def gaps(times: list[float]) -> list[float]:
    """Seconds between consecutive timestamps."""
    return [round(b - a, 3) for a, b in itertools.pairwise(times)]


_EVENT_RE = re.compile(r"\b(\w+) (\{.*\})\s*$")


def log_events(text: str, name: str) -> list[dict[str, Any]]:
    """The fields of every structured ``name {json}`` log line in ``text``."""
    out = []
    for line in text.splitlines():
        match = _EVENT_RE.search(line)
        if match and match.group(1) == name:
            out.append(json.loads(match.group(2)))
    return out


# ------------------------------------------------------------------ HTTP target
@dataclass(frozen=True)
class Hit:
    """One request the target received."""

    path: str
    query: dict[str, str]
    at: float  # time.monotonic() of arrival
    #: The If-None-Match the request sent (a conditional fetch), if any.
    if_none_match: str | None = None

    @property
    def task_id(self) -> str | None:
        """The Celery task id the scrape task sent along."""
        return self.query.get(TASK_ID_PARAM)

    @property
    def worker(self) -> str | None:
        """The name of the worker process (``start_worker(name)``) that ran the task."""
        return self.query.get(WORKER_ID_PARAM)


#: The one version of every ``/etag`` page.
ETAG = '"v1"'


class TargetServer(ThreadingHTTPServer):
    """A local scrape target recording every hit.

    ``/ok...`` answers 200, ``/fail...`` 500, ``/429...`` 429 with
    ``Retry-After: <after>``, ``/slow...?s=N`` sleeps N s before its 200,
    but only on the first request of each task id, so a redelivery is fast,
    ``/sleep...?s=N`` sleeps N s before every 200, and ``/etag...`` answers 200
    with ``ETag: "v1"``, or 304 to an ``If-None-Match: "v1"``.
    """

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _TargetHandler)
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._hits: list[Hit] = []
        self._slow_seen: set[str] = set()

    def url(self, path: str) -> str:
        """Absolute URL of ``path`` on this server."""
        return f"http://127.0.0.1:{self.server_address[1]}{path}"

    def record(self, hit: Hit) -> None:
        with self._lock:
            self._hits.append(hit)

    def first_slow(self, task_id: str) -> bool:
        with self._lock:
            first = task_id not in self._slow_seen
            self._slow_seen.add(task_id)
            return first

    def hits(self, path: str) -> list[Hit]:
        """Hits on exactly ``path`` (query ignored), in arrival order."""
        with self._lock:
            return [h for h in self._hits if h.path == path]

    def hits_under(self, prefix: str) -> list[Hit]:
        """Hits on every path that starts with ``prefix``, in arrival order."""
        with self._lock:
            return [h for h in self._hits if h.path.startswith(prefix)]

    def times(self, path: str) -> list[float]:
        """Arrival times of the hits on ``path``."""
        return [h.at for h in self.hits(path)]


class _TargetHandler(BaseHTTPRequestHandler):
    server: TargetServer
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = dict(parse_qsl(parts.query))
        match = self.headers.get("If-None-Match")
        self.server.record(Hit(parts.path, query, time.monotonic(), match))
        path = parts.path
        if path.startswith("/ok"):
            self._reply(200)
        elif path.startswith("/etag"):
            self._reply(304 if match == ETAG else 200, {"ETag": ETAG})
        elif path.startswith("/fail"):
            self._reply(500)
        elif path.startswith("/429"):
            self._reply(429, {"Retry-After": query.get("after", "2")})
        elif path.startswith("/slow"):
            if self.server.first_slow(query.get(TASK_ID_PARAM, "")):
                self.server.stopping.wait(float(query.get("s", "1")))
            self._reply(200)
        elif path.startswith("/sleep"):
            self.server.stopping.wait(float(query.get("s", "1")))
            self._reply(200)
        else:
            self._reply(404)

    def _reply(self, status: int, headers: dict[str, str] | None = None) -> None:
        body = f"{status}\n".encode()
        with contextlib.suppress(OSError):  # the client may be dead (SIGKILLed worker)
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def targets() -> Iterator[Callable[..., PacedTarget]]:
    """``targets(hold_s, answer=...)``: a :class:`~tests.e2e.targets.PacedTarget` on a
    loopback address of its own (a domain of its own); all stopped in teardown."""
    yield from serve_targets()


@pytest.fixture
def target() -> Iterator[TargetServer]:
    """A local HTTP scrape target in a thread, on a free port of 127.0.0.1."""
    server = TargetServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name="e2e-target", daemon=True)
    thread.start()
    yield server
    server.stopping.set()
    server.shutdown()
    server.server_close()
    thread.join(5)


# -------------------------------------------------------------------- processes
@dataclass
class Proc:
    """A beat or worker subprocess and its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    #: False once the test killed it on purpose.
    expect_alive: bool = True

    @property
    def pid(self) -> int:
        """Process id."""
        return self.popen.pid

    def alive(self) -> bool:
        """The process has not exited."""
        return self.popen.poll() is None

    def text(self) -> str:
        """Everything it logged so far."""
        return self.log.read_text("utf-8", errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL it (a crash) and reap it."""
        self.expect_alive = False
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)

    def crash(self) -> list[int]:
        """SIGKILL it and all its descendants at once, as a machine loss would.

        It is stopped first, so it cannot fork a replacement child meanwhile.
        Returns once none of them can run any more (the descendants, orphaned,
        may stay zombies until init reaps them); returns their pids.
        """
        tree = self.kill_tree()
        self.wait_dead(tree)
        return [child.pid for child in tree]

    def kill_tree(self) -> list[psutil.Process]:
        """Send SIGKILL to it and all its descendants (stopped first, so it cannot fork
        a replacement child meanwhile); none of them runs another instruction, but
        their death is not waited for (:meth:`wait_dead`)."""
        self.expect_alive = False
        main = psutil.Process(self.pid)
        main.suspend()
        tree: list[psutil.Process] = main.children(recursive=True)
        for process in [main, *tree]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        return tree

    def wait_dead(self, tree: list[psutil.Process]) -> None:
        """Until it and the descendants :meth:`kill_tree` killed can no longer run."""
        self.popen.wait(10)
        wait_for(lambda: not any(_can_run(child) for child in tree), 10,
                 f"the processes of {self.name} to die", interval=0.01)

    def stop(self) -> int:
        """SIGTERM it (a clean shutdown), wait for it, and return its exit code."""
        self.expect_alive = False
        self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(STOP_GRACE_S)


def _can_run(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class RedisProcess:
    """A redis-server this test starts and kills itself, on a fixed port."""

    def __init__(self, executable: str, port: int, workdir: Path) -> None:
        self.executable = executable
        self.port = port
        self.workdir = workdir
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        """URL of its db 0."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it (no persistence: a restart comes back empty) and wait for PING."""
        self.starts += 1
        log = self.workdir / f"redis-{self.port}-{self.starts}.log"
        self.popen = subprocess.Popen(
            [self.executable, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
             "--logfile", str(log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            wait_for(self._ping(client), 10, f"redis-server on port {self.port}")
        finally:
            client.close()

    def _ping(self, client: redis.Redis) -> Callable[[], bool]:
        def ping() -> bool:
            assert self.popen is not None and self.popen.poll() is None, "redis-server exited"
            with contextlib.suppress(redis.ConnectionError):
                return bool(client.ping())
            return False
        return ping

    def kill(self) -> None:
        """SIGKILL it, as a crash or a network cut would end it."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)


@dataclass
class Deployment:
    """One isolated celery-zsched deployment and the processes a test runs in it."""

    tmp_path: Path
    env: dict[str, str]
    settings: Settings
    store: Store
    #: The broker's Redis database (``None`` when the broker is RabbitMQ).
    broker: redis.Redis | None
    queue: str
    procs: list[Proc] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    # -------------------------------------------------------------- jobs
    def job(self, **row: Any) -> Job:
        """A validated job with this deployment's defaults (task: the e2e scrape task)."""
        return Job.from_dict(row, self.store.defaults)

    def info(self, job_id: str) -> JobInfo:
        """The job's definition and live state, read from the store."""
        return self.store.get(job_id)

    def wait_info(self, job_id: str, predicate: Callable[[JobInfo], bool], timeout: float,
                  what: str) -> JobInfo:
        """Poll the job until ``predicate`` holds for it; return that snapshot."""
        def check() -> JobInfo | None:
            info = self.info(job_id)
            return info if predicate(info) else None
        return self.wait_for(check, timeout, what)

    # -------------------------------------------------------- processes
    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        log = self.tmp_path / f"{name}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [CELERY, "-A", APP_MODULE, *args], cwd=self.tmp_path,
                env={**self.env, **(env or {})},
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def start_beat(self, name: str = "beat",
                   beat_schedule: dict[str, dict[str, Any]] | None = None,
                   env: dict[str, str] | None = None) -> Proc:
        """``celery beat -S celery_zsched``, optionally with a static ``beat_schedule``."""
        return self._spawn(name, [
            "beat", "-S", "celery_zsched", "--loglevel", "INFO",
            "-s", str(self.tmp_path / f"{name}-schedule")],
            {ENV_BEAT_SCHEDULE: json.dumps(beat_schedule or {}), **(env or {})})

    def start_worker(self, name: str = "worker", pool: str = "solo",
                     concurrency: int = 1, env: dict[str, str] | None = None,
                     args: Sequence[str] = (), queue: str | None = None) -> Proc:
        """``celery worker`` consuming this deployment's queue, or ``queue`` (``env``:
        extra variables, ``args``: more command-line options).

        Its tasks tell the target ``name`` (:attr:`Hit.worker`): give each
        worker process a name of its own.
        """
        return self._spawn(name, [
            "worker", "-P", pool, "-c", str(concurrency), "-Q", queue or self.queue,
            "-n", f"{name}-{uuid.uuid4().hex[:6]}@%h", "--loglevel", "INFO",
            "--without-heartbeat", "--without-gossip", "--without-mingle", *args],
            {ENV_WORKER_ID: name, **(env or {})})

    def check_alive(self) -> None:
        """Fail at once if a process the test relies on has exited."""
        for proc in self.procs:
            if proc.expect_alive and not proc.alive():
                raise AssertionError(
                    f"{proc.name} exited with {proc.popen.returncode}:\n{proc.text()[-4000:]}")

    def wait_for(self, predicate: Callable[[], T | None], timeout: float, what: str) -> T:
        """:func:`wait_for`, failing early if a process died."""
        return wait_for(predicate, timeout, what, check=self.check_alive)

    def stop(self) -> None:
        """SIGTERM every process (SIGKILL after a grace period), then check none is left."""
        tree: list[psutil.Process] = []
        for proc in self.procs:
            with contextlib.suppress(psutil.Error):
                tree += psutil.Process(proc.pid).children(recursive=True)
            if proc.alive():
                proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs:
            try:
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(10)
        _gone, left = psutil.wait_procs(tree, timeout=2)
        for child in left:
            with contextlib.suppress(psutil.Error):
                child.kill()
        # Popen reaped the processes themselves; psutil.Process objects notice a
        # reused pid, so a stranger's process is never mistaken for a leftover.
        leftovers = [p.pid for p in self.procs if p.popen.poll() is None]
        leftovers += [c.pid for c in psutil.wait_procs(left, timeout=5)[1] if c.is_running()]
        leftovers += self._kill_strays()
        assert not leftovers, f"processes left behind: {leftovers}"

    def _kill_strays(self) -> list[int]:
        # Orphans of a process killed on purpose (reparented, so no longer
        # anyone's child here) still carry this deployment's unique queue.
        strays = []
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if process.environ().get(ENV_QUEUE) == self.queue:
                    process.kill()
                    strays.append(process)
        psutil.wait_procs(strays, timeout=5)
        return [p.pid for p in strays]


@pytest.fixture
def deploy(request: pytest.FixtureRequest, redis_server: Any, tmp_path: Path
           ) -> Iterator[Callable[..., Deployment]]:
    """Build a :class:`Deployment`: ``deploy(store_url=None, **zsched_settings)``.

    Settings become ``ZSCHED_*`` variables of the processes' environment, and
    the test's own :class:`Store` reads the same ones. The broker is a database
    of its own on the throwaway server; the store defaults to db 0 of it under
    a unique key prefix. Teardown stops every process, then removes the keys.
    """
    made: list[Deployment] = []
    request.node.stash[_LOGS] = []
    host, port = redis_server.host, redis_server.port

    def make(store_url: str | None = None, *, broker: str = "redis",
             **overrides: Any) -> Deployment:
        index = len(made)
        db = next(_BROKER_DBS)
        queue = f"e2e-{uuid.uuid4().hex[:8]}"
        if broker == "amqp":
            problem = amqp_unreachable(AMQP_URL)
            if problem is not None:
                pytest.fail(f"RabbitMQ unreachable at {AMQP_URL} ({problem})")
        env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV)}
        env.update({
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                        env.get("PYTHONPATH", "")])),
            "PYTHONUNBUFFERED": "1",
            # RabbitMQ: the default vhost, queues of this deployment's own name.
            ENV_BROKER_URL: AMQP_URL if broker == "amqp" else f"redis://{host}:{port}/{db}",
            ENV_QUEUE: queue,
            "ZSCHED_REDIS_URL": store_url or f"redis://{host}:{port}/0",
            "ZSCHED_KEY_PREFIX": "{e2e" + uuid.uuid4().hex[:8] + "}:",
        })
        env.update({"ZSCHED_" + k.upper(): str(v) for k, v in overrides.items()})
        settings = Settings.from_mapping({"zsched_default_task": SCRAPE_TASK}, env)
        workdir = tmp_path / f"deploy{index}"
        workdir.mkdir()
        broker_db = None
        if broker != "amqp":
            broker_db = redis.Redis(host=host, port=port, db=db)
            broker_db.flushdb()  # a database of its own on our throwaway server
        deployment = Deployment(workdir, env, settings, Store.from_settings(settings),
                                broker_db, queue, logs=request.node.stash[_LOGS])
        made.append(deployment)
        return deployment

    yield make
    errors = []
    for deployment in made:
        try:
            deployment.stop()
        except AssertionError as exc:
            errors.append(exc)
        with contextlib.suppress(redis.RedisError):
            deployment.store.client.delete(*deployment.store.keys.all())
        if deployment.broker is not None:
            with contextlib.suppress(redis.RedisError):
                deployment.broker.flushdb()
            deployment.broker.close()
        else:
            delete_amqp_queue(deployment.queue)
        deployment.store.client.close()
    assert not errors, errors


#: The local RabbitMQ (``ZSCHED_TEST_AMQP_URL`` overrides it), for ``deploy(broker="amqp")``.
AMQP_URL = os.environ.get("ZSCHED_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


@functools.cache
def amqp_unreachable(url: str) -> str | None:
    """``None``, or why RabbitMQ cannot be reached (asked once per session)."""
    try:
        with kombu.Connection(url, connect_timeout=3) as conn:
            conn.connect()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def delete_amqp_queue(queue: str) -> None:
    """Delete a deployment's queue (and its messages) from RabbitMQ."""
    with contextlib.suppress(Exception), kombu.Connection(AMQP_URL, connect_timeout=5) as conn:
        kombu.Queue(queue, channel=conn.channel()).delete()


@pytest.fixture
def spare_redis(redis_server: Any, tmp_path: Path) -> Iterator[RedisProcess]:
    """A second throwaway redis-server (started here, killed in teardown) on a free port."""
    workdir = tmp_path / "spare-redis"
    workdir.mkdir()
    server = RedisProcess(str(redis_server.executable), free_port(), workdir)
    server.start()
    yield server
    server.kill()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the log of every process a failing test started to its report."""
    report = yield
    if report.failed:
        for log in item.stash.get(_LOGS, []):
            if log.exists():
                text = log.read_text("utf-8", errors="replace")
                report.sections.append((f"{log.parent.name}/{log.name}", text[-20_000:]))
    return report
