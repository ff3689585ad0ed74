#!/usr/bin/env python
"""Benchmark celery-zsched: import, idle tick, storm drain, beat memory, two beats.

Usage::

    .venv/bin/python benchmarks/bench.py [--sizes 10000,100000] [--json out.json]

Everything runs against two throwaway ``redis-server`` processes that this
script starts on free ports and kills at the end (even on error): one holds
the schedule (the store), the other is the Celery broker, so the broker's
queue memory and command counts never mix with the store's. 127.0.0.1:6379 is
never used.

Each measurement that cares about memory or warm state runs in its own fresh
(spawned) process, so one size never inherits another's heap.

This is a script, not a test: the bars are reported as PASS/FAIL lines in the
printed table, never asserted.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gc
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import redis

MiB = 1024 * 1024
QUEUE = "celery"  # Celery's default queue: where every benchmark job is routed
WARMUP_QUEUE = "bench.warmup"  # warm-up messages go here, never into QUEUE
STORE_PREFIX = "{bench}:"
#: Bars the project is held to.
BAR_DRAIN_JOBS_S = 10_000
BAR_IDLE_TICK_MS = 0.5
BAR_IMPORT_1M_S = 30.0
#: Jobs due within one second: all published by the second's end + this (issue 23).
BAR_SECOND_LAST_MS = 500
#: "Memory does not grow with N": the RSS a beat gains over a whole run (load,
#: idle ticks, storm) stays under this at every N, and the largest N gains at
#: most BAR_RSS_SLACK_MIB more than the smallest.
BAR_RSS_GROWTH_MIB = 32.0
BAR_RSS_SLACK_MIB = 8.0
CHILD_TIMEOUT_S = 1800.0
PHASES = ("import", "idle", "storm", "two", "second")


# --------------------------------------------------------------------- config
@dataclass(frozen=True)
class Cfg:
    """What every child process needs to reach the two servers."""

    store_url: str
    broker_url: str
    interval_s: float
    cron_share: float
    batch_size: int
    idle_ticks: int
    idle_sleep_s: float = 0.001
    #: How far ahead of its one second the "second" phase stores its jobs.
    second_lead_ms: int = 3000
    #: zsched_tracing on, spans to an SDK tracer provider (batched, then dropped).
    tracing: bool = False


def make_app(cfg: Cfg) -> Any:
    """A Celery app on the throwaway broker, with zsched pointed at the store."""
    return celery_app("zsched_bench", cfg.broker_url, cfg.store_url, STORE_PREFIX,
                      cfg.batch_size, zsched_tracing=cfg.tracing)


def celery_app(name: str, broker_url: str, store_url: str, key_prefix: str, batch_size: int,
               **conf: Any) -> Any:
    """A Celery app named ``name`` on ``broker_url``, zsched on ``store_url``; ``conf``: more."""
    from celery import Celery

    app = Celery(name, broker=broker_url)
    app.conf.update(
        zsched_redis_url=store_url,
        zsched_key_prefix=key_prefix,
        zsched_batch_size=batch_size,
        # The storm measures how fast one beat publishes with no worker running:
        # lift the backpressure bound, which would otherwise stop it at 10 x batch.
        zsched_max_queued=100_000_000,
        beat_schedule={},
        broker_connection_retry_on_startup=False,
        **conf,
    )
    return app


def rss_mib() -> float:
    """Resident set size of this process, MiB."""
    return float(psutil.Process().memory_info().rss) / MiB


def make_rows(n: int, cfg: Cfg, tag: str, cron_share: float = 0.0) -> Iterator[dict[str, Any]]:
    """Import rows as a JSON/CSV import would hand them to ``Job.from_dict``.

    URL scrape jobs with an interval and a little ``meta``; ``cron_share`` of
    them are weekly cron jobs in Europe/Berlin instead.
    """
    every = round(1 / cron_share) if cron_share > 0 else 0
    for i in range(n):
        row: dict[str, Any] = {
            "url": f"https://shop{i % 97}.example.com/{tag}/item/{i}",
            "meta": {"i": i, "src": "bench"},
        }
        if every and i % every == 0:
            row["cron"] = "0 3 * * 1"
            row["timezone"] = "Europe/Berlin"
        else:
            row["interval_s"] = cfg.interval_s
        yield row


# ------------------------------------------------------------ redis servers
def _free_port(bus: bool = False) -> int:
    """A free port, never 6379; ``bus``: port + 10000 (a cluster node's bus) fits too."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port != 6379 and not (bus and (port + 10000 >= 65536 or port + 10000 == 6379)):
            return port


class RedisServer:
    """A throwaway ``redis-server`` without persistence, on a free port.

    ``extra``: more ``redis-server`` arguments (with ``--cluster-enabled`` the
    port is one whose bus port is free to use too); ``stop_wait_s``: how long
    :meth:`stop` waits after SIGTERM before it kills.
    """

    def __init__(self, name: str, extra: tuple[str, ...] = (), stop_wait_s: float = 5.0) -> None:
        self.name = name
        self.extra = extra
        self.stop_wait_s = stop_wait_s
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir = tempfile.mkdtemp(prefix=f"zsched-bench-{name}-")

    def start(self) -> RedisServer:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server not found on PATH")
        for _ in range(10):
            self.port = _free_port(bus="--cluster-enabled" in self.extra)
            self.proc = subprocess.Popen(
                [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.dir, "--daemonize", "no", *self.extra],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if self.client().ping():
                        return self
                except redis.ConnectionError:
                    time.sleep(0.05)
            self.stop(keep_dir=True)  # the next try runs in the same directory
        raise RuntimeError(f"could not start redis-server for {self.name}")

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def stop(self, keep_dir: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(self.stop_wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        if not keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def command_calls(client: redis.Redis) -> Counter[str]:
    """Calls per command name from INFO commandstats (including calls made inside Lua)."""
    stats = client.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})


def command_delta(before: Counter[str], after: Counter[str]) -> Counter[str]:
    """Commands run between two snapshots, leaving out INFO (the measuring itself)."""
    delta = Counter({k: after[k] - before.get(k, 0) for k in after if k != "info"})
    return +delta


class RoundTrips:
    """Counts request writes (one per command, one per pipeline per node) to ``ports``."""

    def __init__(self, *ports: int) -> None:
        from redis.connection import AbstractConnection

        self.ports = set(ports)
        self.count = 0
        self._cls = AbstractConnection
        self._orig: Callable[..., Any] = AbstractConnection.send_packed_command

    def __enter__(self) -> RoundTrips:
        orig, counter = self._orig, self

        def counting(conn: Any, command: Any, check_health: bool = True) -> Any:
            if getattr(conn, "port", None) in counter.ports:
                counter.count += 1
            return orig(conn, command, check_health)

        self._cls.send_packed_command = counting  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self._cls.send_packed_command = self._orig  # type: ignore[method-assign]


# ----------------------------------------------------------- child processes
def child_main(fn: Callable[..., Any], args: tuple[Any, ...], conn: Connection) -> None:
    """A spawned child's body: send ``fn(*args)`` (or the traceback) back over ``conn``."""
    try:
        conn.send(("ok", fn(*args)))
    except BaseException:
        conn.send(("err", traceback.format_exc()))
    finally:
        conn.close()


def _receive(conn: Connection, what: str, timeout: float = CHILD_TIMEOUT_S) -> Any:
    if not conn.poll(timeout):
        raise TimeoutError(f"{what}: no answer within {timeout:.0f}s")
    status, value = conn.recv()
    if status != "ok":
        raise RuntimeError(f"{what} failed in the child process:\n{value}")
    return value


class Child:
    """``fn(*args)`` started in a fresh spawned process; :meth:`result` waits for its answer."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        ctx = mp.get_context("spawn")
        self.name = fn.__name__
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=child_main, args=(fn, args, child), daemon=True)
        self.proc.start()
        child.close()

    def result(self, timeout: float = CHILD_TIMEOUT_S) -> Any:
        """What ``fn`` returned; ``TimeoutError`` when it does not answer within ``timeout`` s."""
        return _receive(self.conn, self.name, timeout)

    def stop(self) -> None:
        """Wait a little for the process to end, then kill it."""
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


def run_child(fn: Callable[..., Any], *args: Any, timeout: float = CHILD_TIMEOUT_S) -> Any:
    """Run ``fn(*args)`` in a fresh spawned process and return its result.

    Raises ``TimeoutError`` when it does not answer within ``timeout`` seconds.
    """
    child = Child(fn, *args)
    try:
        return child.result(timeout)
    finally:
        child.stop()


# ---------------------------------------------------------- celery processes
HERE = Path(__file__).resolve().parent
CELERY = str(Path(sys.executable).parent / "celery")
#: How long :meth:`CeleryFleet.stop` waits after SIGTERM before it kills.
STOP_GRACE_S = 15.0
#: Celery settings of a fleet's app: no results, no remote control or events (no
#: traffic but the tasks'), UTC, no static beat entries.
FLEET_APP_CONF: dict[str, Any] = {
    "task_ignore_result": True,
    "worker_enable_remote_control": False,
    "worker_send_task_events": False,
    "broker_connection_retry_on_startup": True,
    "timezone": "UTC",
    "beat_schedule": {},
}


def lazy_app(factory: Callable[[], Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) whose ``app`` is ``factory()``, built on first use.

    ``__getattr__ = lazy_app(_make_app)`` in a benchmark makes it the Celery app
    of ``celery -A <module>:app`` processes (with this directory on
    ``PYTHONPATH``), while the benchmark itself never builds it, nor needs the
    environment the app reads.
    """
    built: list[Any] = []

    def module_getattr(name: str) -> Any:
        if name != "app":
            raise AttributeError(name)
        if not built:
            built.append(factory())
        return built[0]

    return module_getattr


class CeleryFleet:
    """``celery -A <app> worker`` and ``beat`` subprocesses, each in a session of its own.

    A session of its own lets :meth:`stop` reach a prefork worker's pool
    children too (a worker that is killed would otherwise leave them behind).
    The processes inherit this environment without its ``ZSCHED_``,
    ``CELERY_`` and ``DJANGO_`` variables (and those starting with one of
    ``drop``): inherited settings would leak into the fleet, and
    ``DJANGO_SETTINGS_MODULE`` (set under pytest-django) would make Celery's
    Django fixup import a project. ``env`` is added, and this directory goes
    first on ``PYTHONPATH``. Logs go to ``logdir/<tag>-<name>.log``.
    """

    def __init__(self, app: str, logdir: str, tag: str, env: dict[str, str],
                 drop: tuple[str, ...] = ()) -> None:
        self.app = app
        self.logdir = logdir
        self.tag = tag
        keep = {k: v for k, v in os.environ.items()
                if not k.startswith(("ZSCHED_", "CELERY_", "DJANGO_", *drop))}
        self.env = {**keep, "PYTHONPATH": os.pathsep.join([str(HERE), keep.get("PYTHONPATH", "")]),
                    **env}
        self.procs: list[subprocess.Popen[bytes]] = []
        #: Each process's kind, by pid: "beat" or "workers".
        self.kinds: dict[int, str] = {}

    def spawn(self, kind: str, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        """Start ``celery -A <app> *args`` as a process of ``kind``, logging to ``name``."""
        with open(Path(self.logdir) / f"{self.tag}-{name}.log", "wb") as log:
            proc = subprocess.Popen(
                [CELERY, "-A", self.app, *args], cwd=self.logdir, env=self.env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.procs.append(proc)
        self.kinds[proc.pid] = kind
        return proc

    def start_worker(self, name: str, concurrency: int) -> None:
        """A prefork worker of ``concurrency`` children, named ``<name>-<tag>@<host>``,
        without heartbeat, gossip or mingle (no chatter between workers)."""
        self.spawn("workers", name, [
            "worker", "-P", "prefork", "-c", str(concurrency), "-n", f"{name}-{self.tag}@%h",
            "--loglevel", "WARNING", "--without-heartbeat", "--without-gossip",
            "--without-mingle"])

    def start_beat(self) -> None:
        """``celery beat -S celery_zsched``."""
        self.spawn("beat", "beat", ["beat", "-S", "celery_zsched", "--loglevel", "WARNING",
                                    "-s", str(Path(self.logdir) / f"{self.tag}-beat-schedule")])

    def wait_ready(self, client: redis.Redis, key: str, count: int,
                   timeout: float = 120.0) -> None:
        """Wait until the set ``key`` has ``count`` members (the app's ``worker_ready``
        handler adds one per worker), while every process lives."""
        deadline = time.monotonic() + timeout
        while int(client.scard(key)) < count:  # type: ignore[arg-type]
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workers did not get ready within {timeout:.0f} s")
            time.sleep(0.1)

    def check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}; logs in "
                                   f"{self.logdir}")

    def send_signal(self, kind: str, sig: int) -> None:
        """Send ``sig`` to every process of ``kind`` (not to its children)."""
        for proc in self.procs:
            if self.kinds[proc.pid] == kind:
                os.kill(proc.pid, sig)

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds so far (user + system) of the beats and of the workers (pool
        children included), by kind."""
        out = {"beat": 0.0, "workers": 0.0}
        for proc in self.procs:
            with contextlib.suppress(psutil.Error):
                top = psutil.Process(proc.pid)
                for each in [top, *top.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        times = each.cpu_times()
                        out[self.kinds[proc.pid]] += float(times.user + times.system)
        return out

    def stop(self) -> None:
        """SIGTERM every process group (beats first: no new claims), then kill what stays.

        SIGCONT follows the SIGTERM, so a stopped process handles it too.
        """
        for proc in reversed(self.procs):
            for sig in (signal.SIGTERM, signal.SIGCONT):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            # The group too: a pool child may outlive its parent for a moment.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self.procs.clear()
        self.kinds.clear()


# ------------------------------------------------------------------- import
def import_jobs(cfg: Cfg, n: int, stagger: bool, tag: str) -> dict[str, Any]:
    """Validate ``n`` rows with ``Job.from_dict``, then store them with ``upsert_many``.

    As ``celery_zsched.core.formats`` does it: every row is validated (with the
    garbage collector paused) before anything is written, then one
    ``upsert_many`` stores the list. Making the rows is not timed: it stands
    for reading the file.
    """
    from celery_zsched.config import Settings
    from celery_zsched.core.job import Defaults, Job
    from celery_zsched.store import Store

    settings = Settings(redis_url=cfg.store_url, key_prefix=STORE_PREFIX,
                        batch_size=cfg.batch_size)
    store = Store.from_settings(settings)
    defaults = Defaults.from_settings(settings)
    store.now_ms()  # connect outside the timing
    rows = list(make_rows(n, cfg, tag, cfg.cron_share if stagger else 0.0))
    clock = time.perf_counter
    from_dict = Job.from_dict
    gc.disable()
    try:
        started = clock()
        jobs = [from_dict(row, defaults, row=i) for i, row in enumerate(rows)]
        validate_s = clock() - started
    finally:
        gc.enable()
    del rows
    started, cpu = clock(), time.process_time()
    redis_cpu = _redis_cpu_s(store.client)
    report = store.upsert_many(jobs, stagger=stagger, total=n)
    store_s = clock() - started
    store_cpu_s = time.process_time() - cpu
    redis_cpu = _redis_cpu_s(store.client) - redis_cpu
    keys = store.keys
    counts = {"defs": store.client.hlen(keys.defs), "scheduled": store.client.zcard(keys.schedule)}
    store.client.close()
    total_s = validate_s + store_s
    return {"n": n, "stagger": stagger, "total_s": total_s, "validate_s": validate_s,
            "store_s": store_s, "store_cpu_s": store_cpu_s, "redis_cpu_s": redis_cpu,
            "created": report.created, "rows_per_s": n / total_s, **counts}


def import_second(cfg: Cfg, n: int, lead_ms: int) -> dict[str, Any]:
    """``n`` jobs falling due evenly over one second that starts ``lead_ms`` from now
    (the store's clock): T0 = that start; every job is due by T0 + 1 s."""
    from celery_zsched.config import Settings
    from celery_zsched.core.job import Defaults, Job
    from celery_zsched.store import Store

    settings = Settings(redis_url=cfg.store_url, key_prefix=STORE_PREFIX,
                        batch_size=cfg.batch_size)
    store = Store.from_settings(settings)
    defaults = Defaults.from_settings(settings)
    jobs = [Job.from_dict(row, defaults, row=i) for i, row in enumerate(make_rows(n, cfg, "sec"))]
    t0 = store.now_ms() + lead_ms
    first_due: dict[str, int | None] = {job.id: t0 + i * 1000 // n for i, job in enumerate(jobs)}
    store.upsert_many(jobs, stagger=False, total=n, first_due=first_due)
    left_ms = t0 - store.now_ms()
    store.client.close()
    return {"t0_ms": t0, "lead_left_ms": left_ms}


def _redis_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# ---------------------------------------------------------------------- beat
def trace_to_nowhere() -> None:
    """A tracer provider as a project would set one up (the SDK, a batch processor),
    whose exporter drops the spans: the cost measured is beat's, not a collector's."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)


class BeatHarness:
    """A real ``ZSchedScheduler`` in this process, driven tick by tick."""

    def __init__(self, cfg: Cfg, store_port: int) -> None:
        from celery_zsched.beat.scheduler import ZSchedScheduler

        self.cfg = cfg
        self.store_port = store_port
        if cfg.tracing:
            trace_to_nowhere()
        self.app = make_app(cfg)
        self.sched = ZSchedScheduler(self.app)
        self.monitor = redis.Redis.from_url(cfg.store_url, decode_responses=True)
        self.claimed = 0
        count_claims(self)

    def warmup(self) -> dict[str, Any]:
        """First ticks on an empty store, and a warm producer; returns RSS before any job."""
        for _ in range(20):
            self.sched.tick()
        producer: Any = self.sched.producer
        with producer.batch(max_size=10):
            for i in range(10):
                self.app.send_task("scrape", kwargs={"url": "https://w.example.com", "i": i},
                                   producer=producer, queue=WARMUP_QUEUE)
        return {"rss_mib": rss_mib(), "pid": os.getpid()}

    def drain(self, max_ticks: int = 10_000_000) -> dict[str, Any]:
        """Tick until a tick reports it is waiting (no full batch): the due jobs are out."""
        self.claimed = 0
        ticks = 0
        cpu = time.process_time()
        started = time.monotonic()
        while ticks < max_ticks:
            ticks += 1
            if self.sched.tick() > 0:
                break
        ended = time.monotonic()
        return {"claimed": self.claimed, "ticks": ticks, "started": started, "ended": ended,
                "seconds": ended - started, "cpu_s": time.process_time() - cpu,
                "rss_mib": rss_mib()}

    def second(self, n: int, t0_ms: int) -> dict[str, Any]:
        """Run as ``celery beat`` does (tick, then sleep what it returns) until the ``n``
        jobs due from ``t0_ms`` to ``t0_ms`` + 1 s are published.

        Each publish is timed on the store's Redis clock (``TIME``, one round trip
        after the batch is out and confirmed), the clock the due times are on.
        """
        sched = self.sched
        publish = sched._publish
        done: list[tuple[int, int, int]] = []  # (Redis ms when out, jobs, latest due ms)
        lateness: list[int] = []

        def timed(jobs: Any) -> int:
            count = publish(jobs)
            now = sched.store.now_ms()
            done.append((now, count, max(c.due_ms for c in jobs)))
            lateness.extend(now - c.due_ms for c in jobs)
            return count

        sched._publish = timed  # type: ignore[method-assign]
        deadline = time.monotonic() + 60 + (t0_ms - sched.store.now_ms()) / 1000
        try:
            while sum(c for _, c, _ in done) < n and time.monotonic() < deadline:
                time.sleep(sched.tick())
        finally:
            del sched._publish
        lateness.sort()
        published = sum(c for _, c, _ in done)
        last_ms = max((t for t, _, _ in done), default=t0_ms)
        return {"published": published, "batches": len(done),
                "last_after_t1_ms": last_ms - (t0_ms + 1000),
                "first_out_ms": min((t for t, _, _ in done), default=t0_ms) - t0_ms,
                "late_p50_ms": lateness[len(lateness) // 2] if lateness else None,
                "late_p99_ms": lateness[min(len(lateness) - 1, len(lateness) * 99 // 100)]
                if lateness else None,
                "late_max_ms": lateness[-1] if lateness else None}

    def idle(self) -> dict[str, Any]:
        """Time ``idle_ticks`` ticks with nothing due, and count their Redis commands."""
        pre = self.drain()
        self.claimed = 0
        times: list[float] = []
        clock = time.perf_counter
        sleep = self.cfg.idle_sleep_s
        cpu = 0.0
        before = command_calls(self.monitor)
        redis_cpu = _redis_cpu_s(self.monitor)
        with RoundTrips(self.store_port) as trips:
            for _ in range(self.cfg.idle_ticks):
                time.sleep(sleep)  # a real beat sleeps between ticks; don't time a hot loop
                c0 = time.process_time()
                t0 = clock()
                self.sched.tick()
                times.append(clock() - t0)
                cpu += time.process_time() - c0
        redis_cpu = _redis_cpu_s(self.monitor) - redis_cpu
        calls = command_delta(before, command_calls(self.monitor))
        times_ms = sorted(t * 1000 for t in times)
        ticks = len(times_ms)
        return {
            "pre_drained": pre["claimed"], "claimed_during": self.claimed, "ticks": ticks,
            "p50_ms": statistics.median(times_ms),
            "p99_ms": times_ms[min(ticks - 1, int(ticks * 0.99))],
            "max_ms": times_ms[-1],
            "cmds_per_tick": sum(calls.values()) / ticks,
            "round_trips_per_tick": trips.count / ticks,
            "cpu_us": cpu / ticks * 1e6, "redis_cpu_us": redis_cpu / ticks * 1e6,
            "cmd_breakdown": {k: round(v / ticks, 2) for k, v in calls.most_common()},
            "rss_mib": rss_mib(),
        }


def count_claims(beat: Any) -> None:
    """Add the jobs of each ``claim_parts`` (what a tick claims with) to ``beat.claimed``."""
    store = beat.sched.store
    claim_parts = store.claim_parts

    def counting(*args: Any, **kwargs: Any) -> Any:
        batches = claim_parts(*args, **kwargs)
        beat.claimed += sum(len(b.jobs) for b in batches.values())
        return batches

    store.claim_parts = counting


def _beat_server(cfg: Cfg, store_port: int, conn: Connection) -> None:
    """A beat process that runs the parent's commands (warmup, idle, drain) in turn."""
    try:
        beat = BeatHarness(cfg, store_port)
    except BaseException:
        conn.send(("err", traceback.format_exc()))
        return
    conn.send(("ok", None))
    while True:
        cmd, *args = conn.recv()
        if cmd == "stop":
            break
        try:
            conn.send(("ok", getattr(beat, cmd)(*args)))
        except BaseException:
            conn.send(("err", traceback.format_exc()))
    beat.sched.close()


class BeatProcess:
    """Parent side of :func:`_beat_server`."""

    def __init__(self, cfg: Cfg, store_port: int) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_beat_server, args=(cfg, store_port, child), daemon=True)
        self.proc.start()
        child.close()
        _receive(self.conn, "beat start-up", 120)

    def call(self, cmd: str, *args: Any) -> Any:
        self.conn.send((cmd, *args))
        return _receive(self.conn, f"beat {cmd}")

    def stop(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self.conn.send(("stop",))
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


def _drainer(cfg: Cfg, store_port: int, go: Any, conn: Connection) -> None:
    """One of several beats draining the same storm: warm up, wait for ``go``, drain."""
    try:
        beat = BeatHarness(cfg, store_port)
        conn.send(("ok", beat.warmup()))
        go.wait()
        conn.send(("ok", beat.drain()))
        beat.sched.close()
    except BaseException:
        conn.send(("err", traceback.format_exc()))


# ------------------------------------------------------------------ broker
def verify_broker(broker_url: str, n: int) -> dict[str, Any]:
    """Read every message in the queue: count, duplicates, and that each is consumable.

    A message is consumable when it is a Celery protocol 2 message for task
    ``scrape`` whose task id is the deterministic id of the occurrence named by
    its zsched headers, and whose body holds ``url`` and ``meta`` kwargs.
    """
    from celery_zsched.store import task_id_for

    client = redis.Redis.from_url(broker_url, decode_responses=True)
    length = int(client.llen(QUEUE))
    task_ids: set[str] = set()
    job_ids: set[str] = set()
    bad: list[str] = []
    step = 10_000
    for start in range(0, length, step):
        for raw in client.lrange(QUEUE, start, start + step - 1):
            msg = json.loads(raw)
            headers = msg["headers"]
            task_ids.add(headers["id"])
            job_ids.add(headers.get("zsched_job_id", ""))
            if len(bad) < 5:
                problem = _message_problem(msg, headers, task_id_for)
                if problem:
                    bad.append(problem)
    client.close()
    return {"llen": length, "unique_task_ids": len(task_ids), "unique_job_ids": len(job_ids),
            "ok": length == n and len(task_ids) == n and len(job_ids) == n and not bad,
            "bad": bad}


def _message_problem(msg: dict[str, Any], headers: dict[str, Any],
                     task_id_for: Callable[[str, int, int], str]) -> str:
    if headers.get("task") != "scrape" or headers.get("lang") != "py":
        return f"wrong task/lang headers: {headers}"
    if msg.get("content-type") != "application/json":
        return f"content-type {msg.get('content-type')}"
    expected = task_id_for(headers["zsched_job_id"], int(headers["zsched_occurrence"]),
                           int(headers["zsched_attempt"]))
    if headers["id"] != expected or msg["properties"].get("correlation_id") != expected:
        return f"task id {headers['id']} is not the occurrence's deterministic id"
    args, kwargs, _embed = json.loads(base64.b64decode(msg["body"]))
    if args != [] or "url" not in kwargs or "meta" not in kwargs:
        return f"unexpected body {args} {kwargs}"
    return ""


# ----------------------------------------------------------------- baseline
def bare_send_task(cfg: Cfg, m: int, batched: bool) -> dict[str, Any]:
    """``app.send_task`` in a loop with one reused producer: the rate to beat.

    The messages match what zsched sends (url/meta kwargs, zsched headers, a
    given task id), all prepared before the timing starts. ``batched`` wraps
    the loop in ``producer.batch()`` (1000 per flush), as zsched does.
    """
    import uuid

    app = make_app(cfg)
    broker = redis.Redis.from_url(cfg.broker_url)
    broker.delete(QUEUE)
    producer = app.amqp.Producer(app.connection_for_write(), auto_declare=False)
    for i in range(20):  # warm up: connection, routes, code paths
        app.send_task("scrape", kwargs={"url": "https://w.example.com", "i": i},
                      producer=producer, queue=WARMUP_QUEUE)
    msgs = [({"url": f"https://shop{i % 97}.example.com/base/item/{i}",
              "meta": {"i": i, "src": "bench"}}, str(uuid.uuid4()),
             {"zsched_job_id": f"j{i}", "zsched_occurrence": 1, "zsched_attempt": 1,
              "zsched_due_ms": 1, "zsched_promoted_ms": 2}) for i in range(m)]
    send = app.send_task
    started = time.perf_counter()
    if batched:
        for start in range(0, m, 1000):
            with producer.batch(max_size=1000):
                for kwargs, task_id, headers in msgs[start:start + 1000]:
                    send("scrape", args=[], kwargs=kwargs, task_id=task_id, headers=headers,
                         producer=producer)
    else:
        for kwargs, task_id, headers in msgs:
            send("scrape", args=[], kwargs=kwargs, task_id=task_id, headers=headers,
                 producer=producer)
    seconds = time.perf_counter() - started
    length = int(broker.llen(QUEUE))
    broker.delete(QUEUE)
    return {"messages": m, "seconds": seconds, "rate": m / seconds, "llen_ok": length == m}


# ----------------------------------------------------------------- one size
@dataclass
class SizeResult:
    n: int
    imported: dict[str, Any] = field(default_factory=dict)
    rss_before_mib: float = 0.0
    idle: dict[str, Any] = field(default_factory=dict)
    storm_load: dict[str, Any] = field(default_factory=dict)
    storm: dict[str, Any] = field(default_factory=dict)
    storm_check: dict[str, Any] = field(default_factory=dict)
    second: dict[str, Any] = field(default_factory=dict)
    rss_after_mib: float | None = None  # after the storm, else after the idle ticks
    two: dict[str, Any] = field(default_factory=dict)
    two_check: dict[str, Any] = field(default_factory=dict)


def server_cpu_s(*servers: RedisServer) -> float:
    """CPU seconds the servers have used so far (INFO cpu, user + system)."""
    return sum(_redis_cpu_s(server.client()) for server in servers)


def reset(*servers: RedisServer) -> None:
    for server in servers:
        client = server.client()
        client.flushall()
        client.close()


def bench_size(n: int, cfg: Cfg, store: RedisServer, broker: RedisServer,
               phases: set[str], log: Callable[[str], None]) -> SizeResult:
    res = SizeResult(n)
    reset(store, broker)
    beat = BeatProcess(cfg, store.port)
    try:
        res.rss_before_mib = beat.call("warmup")["rss_mib"]
        if "import" in phases:
            log(f"N={n:,}: staggered import")
            res.imported = run_child(import_jobs, cfg, n, True, "imp")
            log(f"N={n:,}: import {res.imported['total_s']:.2f}s")
            if "idle" in phases:
                log(f"N={n:,}: idle ticks")
                res.idle = beat.call("idle")
                res.rss_after_mib = res.idle["rss_mib"]
                log(f"N={n:,}: idle p50 {res.idle['p50_ms']:.3f} ms")
        if "storm" in phases:
            log(f"N={n:,}: loading storm")
            reset(store, broker)
            res.storm_load = run_child(import_jobs, cfg, n, False, "storm")
            log(f"N={n:,}: draining storm with one beat")
            redis_cpu = server_cpu_s(store, broker)
            res.storm = beat.call("drain")
            res.storm["redis_cpu_s"] = server_cpu_s(store, broker) - redis_cpu
            res.storm["rate"] = res.storm["claimed"] / res.storm["seconds"]
            res.rss_after_mib = res.storm["rss_mib"]
            log(f"N={n:,}: {res.storm['rate']:,.0f} jobs/s; checking the broker")
            res.storm_check = verify_broker(cfg.broker_url, n)
            res.storm_check["schedule_left"] = int(
                store.client().zcard(STORE_PREFIX + "schedule"))
        if "second" in phases:
            log(f"N={n:,}: due within one second")
            reset(store, broker)
            beat.call("drain")  # learns that the store is empty
            loaded = run_child(import_second, cfg, n, cfg.second_lead_ms)
            res.second = {**loaded, **beat.call("second", n, loaded["t0_ms"])}
            res.second["llen"] = int(broker.client().llen(QUEUE))
            log(f"N={n:,}: last published at T0 + 1 s + {res.second['last_after_t1_ms']} ms")
    finally:
        beat.stop()
    if "two" in phases:
        log(f"N={n:,}: draining storm with two beats")
        res.two, res.two_check = two_beat_storm(n, cfg, store, broker)
    return res


def two_beat_storm(n: int, cfg: Cfg, store: RedisServer,
                   broker: RedisServer) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two beat processes drain one storm of ``n`` due jobs; wall time from ``go``."""
    reset(store, broker)
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    procs, conns = [], []
    try:
        for _ in range(2):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_drainer, args=(cfg, store.port, go, child), daemon=True)
            proc.start()
            child.close()
            procs.append(proc)
            conns.append(parent)
        for conn in conns:
            _receive(conn, "drainer warm-up", 120)
        run_child(import_jobs, cfg, n, False, "two")
        started = time.monotonic()
        go.set()
        parts = [_receive(conn, "drainer") for conn in conns]
    finally:
        go.set()
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    seconds = max(p["ended"] for p in parts) - started
    claimed = [p["claimed"] for p in parts]
    out = {"seconds": seconds, "claimed": claimed, "rate": sum(claimed) / seconds,
           "rss_mib": [p["rss_mib"] for p in parts]}
    check = verify_broker(cfg.broker_url, n)
    check["claimed_total_ok"] = sum(claimed) == n
    return out, check


# -------------------------------------------------------------------- table
def _pf(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _ok(ok: bool) -> str:
    return "OK" if ok else "MISMATCH"


def render(results: list[SizeResult], base: dict[str, Any], based: dict[str, Any],
           cfg: Cfg) -> str:
    """The markdown table: one column per size; ``-`` where a phase did not run."""
    cols = [f"N={r.n:,}" for r in results]
    lines = ["| metric | " + " | ".join(cols) + " | bar |",
             "|---|" + "---|" * len(cols) + "---|"]

    def row(name: str, part: str, fmt: Callable[[SizeResult], str], bar: str = "") -> None:
        cells = [fmt(r) if getattr(r, part) else "-" for r in results]
        if any(c != "-" for c in cells):
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {bar} |")

    def imp_1m(r: SizeResult) -> str:
        secs = 1e6 / r.imported["rows_per_s"]
        if r.n >= 1_000_000:
            return f"{secs:.1f} {_pf(secs < BAR_IMPORT_1M_S)}"
        if r.n >= 100_000:
            return f"{secs:.1f} (proj.) {_pf(secs < BAR_IMPORT_1M_S)}"
        return f"{secs:.1f} (proj.; N too small to judge)"

    row("import: validate (Job.from_dict) s", "imported",
        lambda r: f"{r.imported['validate_s']:.2f}")
    row("import: store (upsert_many) s", "imported", lambda r: f"{r.imported['store_s']:.2f}")
    row("import: validate+store s", "imported", lambda r: f"{r.imported['total_s']:.2f}")
    row("import: rows/s", "imported", lambda r: f"{r.imported['rows_per_s']:,.0f}")
    row("import: store CPU us/row, Python + Redis (they overlap)", "imported",
        lambda r: f"{r.imported['store_cpu_s'] / r.n * 1e6:.1f} + "
                  f"{r.imported['redis_cpu_s'] / r.n * 1e6:.1f}", "noise-free view")
    row("import: 1M rows s (measured at N=1M, else projected)", "imported", imp_1m,
        f"< {BAR_IMPORT_1M_S:.0f} s")
    row("import: stored == N", "imported", lambda r: _ok(
        r.imported["defs"] == r.n == r.imported["scheduled"] == r.imported["created"]))
    row(f"idle tick p50 ms ({cfg.idle_ticks} ticks, {cfg.idle_sleep_s * 1000:g} ms apart)", "idle",
        lambda r: f"{r.idle['p50_ms']:.3f} {_pf(r.idle['p50_ms'] < BAR_IDLE_TICK_MS)}",
        f"< {BAR_IDLE_TICK_MS} ms")
    row("idle tick p99 ms", "idle",
        lambda r: f"{r.idle['p99_ms']:.3f} {_pf(r.idle['p99_ms'] < BAR_IDLE_TICK_MS)}",
        f"< {BAR_IDLE_TICK_MS} ms")
    row("idle tick: CPU us/tick, beat + store Redis", "idle",
        lambda r: f"{r.idle['cpu_us']:.0f} + {r.idle['redis_cpu_us']:.0f}", "noise-free view")
    row("idle tick: Redis commands/tick (INFO commandstats, incl. inside Lua)", "idle",
        lambda r: f"{r.idle['cmds_per_tick']:.2f}", "constant in N")
    row("idle tick: round trips/tick (client side)", "idle",
        lambda r: f"{r.idle['round_trips_per_tick']:.2f}", "constant in N")
    row("idle tick: jobs that fell due meanwhile", "idle", lambda r: str(r.idle["claimed_during"]))
    row("storm: 1 beat drain, jobs/s", "storm",
        lambda r: f"{r.storm['rate']:,.0f} {_pf(r.storm['rate'] >= BAR_DRAIN_JOBS_S)}",
        f">= {BAR_DRAIN_JOBS_S:,}")
    row("storm: 1 beat drain s / ticks", "storm",
        lambda r: f"{r.storm['seconds']:.2f} / {r.storm['ticks']}")
    row("storm: CPU us/job, beat + Redis (store+broker)", "storm",
        lambda r: f"{r.storm['cpu_s'] / r.n * 1e6:.0f} + {r.storm['redis_cpu_s'] / r.n * 1e6:.0f}",
        "noise-free view")
    row("storm: jobs/s if CPU were never shared (N / CPU s)", "storm",
        lambda r: f"{r.n / (r.storm['cpu_s'] + r.storm['redis_cpu_s']):,.0f}")
    row("storm: broker LLEN == N, unique ids, consumable", "storm_check",
        lambda r: f"{r.storm_check['llen']:,} "
                  f"{_ok(r.storm_check['ok'] and r.storm_check['schedule_left'] == 0)}")
    row("storm: ratio to bare send_task (reused producer)", "storm",
        lambda r: f"{r.storm['rate'] / base['rate']:.2f}x")
    row("storm: ratio to send_task in producer.batch()", "storm",
        lambda r: f"{r.storm['rate'] / based['rate']:.2f}x")
    row("second: N due over 1 s (T0..T1), last out at T1 + ms", "second",
        lambda r: f"{r.second['last_after_t1_ms']:,} "
                  f"{_pf(r.second['last_after_t1_ms'] <= BAR_SECOND_LAST_MS)}",
        f"<= {BAR_SECOND_LAST_MS} (Redis clock)")
    row("second: lateness ms, out - due, p50 / p99 / max", "second",
        lambda r: f"{r.second['late_p50_ms']} / {r.second['late_p99_ms']} / "
                  f"{r.second['late_max_ms']}")
    def second_ok(r: SizeResult) -> str:
        sec = r.second
        return _ok(sec["published"] == sec["llen"] == r.n and sec["lead_left_ms"] > 0)

    row("second: published, broker LLEN, batches, lead left ms", "second",
        lambda r: f"{r.second['published']:,}, {r.second['llen']:,}, {r.second['batches']}, "
                  f"{r.second['lead_left_ms']:,} {second_ok(r)}")
    row("storm: 2 beats drain, jobs/s (split)", "two",
        lambda r: f"{r.two['rate']:,.0f} ({'/'.join(str(c) for c in r.two['claimed'])})",
        "> 1 beat")
    row("storm: 2 beats speed-up over 1 beat", "two",
        lambda r: f"{r.two['rate'] / r.storm['rate']:.2f}x" if r.storm else "-")
    row("storm: 2 beats LLEN == N, no duplicate task id", "two_check",
        lambda r: f"{r.two_check['llen']:,} "
                  f"{_ok(r.two_check['ok'] and r.two_check['claimed_total_ok'])}")
    measured = [r for r in results if r.rss_after_mib is not None]
    growth = {r.n: (r.rss_after_mib or 0.0) - r.rss_before_mib for r in measured}
    flat = not growth or max(growth.values()) - growth[measured[0].n] <= BAR_RSS_SLACK_MIB
    row("beat RSS before any job MiB", "rss_before_mib", lambda r: f"{r.rss_before_mib:.1f}")
    row("beat RSS after idle ticks MiB", "idle", lambda r: f"{r.idle['rss_mib']:.1f}")
    row("beat RSS after storm MiB", "storm", lambda r: f"{r.storm['rss_mib']:.1f}")
    row("beat RSS growth MiB (last - before)", "rss_after_mib",
        lambda r: f"{growth[r.n]:+.1f} {_pf(growth[r.n] < BAR_RSS_GROWTH_MIB and flat)}",
        f"< {BAR_RSS_GROWTH_MIB:.0f}, largest N <= smallest + {BAR_RSS_SLACK_MIB:.0f}")
    lines.append("| baseline: bare send_task msgs/s | " + " | ".join(
        [f"{base['rate']:,.0f}"] * len(results))
        + f" | {base['messages']:,} msgs, LLEN {_ok(base['llen_ok'])} |")
    lines.append("| baseline: send_task in producer.batch() msgs/s | " + " | ".join(
        [f"{based['rate']:,.0f}"] * len(results)) + f" | LLEN {_ok(based['llen_ok'])} |")
    return "\n".join(lines)


# --------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", default="10000,100000",
                        help="comma-separated job counts (default: 10000,100000)")
    parser.add_argument("--interval-s", type=float, default=7 * 86400.0,
                        help="interval of imported jobs; long, so few fall due while idle "
                             "ticks are timed (default: one week)")
    parser.add_argument("--cron-share", type=float, default=0.0,
                        help="share of imported rows that are weekly cron jobs (default 0)")
    parser.add_argument("--batch-size", type=int, default=1000,
                        help="zsched_batch_size (default 1000, the shipped default)")
    parser.add_argument("--idle-ticks", type=int, default=1000)
    parser.add_argument("--idle-sleep-ms", type=float, default=1.0,
                        help="sleep between timed idle ticks (default 1 ms)")
    parser.add_argument("--baseline-messages", type=int, default=20_000)
    parser.add_argument("--phases", default=",".join(PHASES),
                        help="which phases to run, of " + ",".join(PHASES)
                             + " (idle needs import). For 1M jobs, try --phases import,idle")
    parser.add_argument("--second-lead-ms", type=int, default=3000,
                        help="how far ahead the 'second' phase's second starts; its import "
                             "must end before (default 3000)")
    parser.add_argument("--tracing", action="store_true",
                        help="beat with zsched_tracing on (spans batched by the SDK, dropped)")
    parser.add_argument("--json", help="also write raw results to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    if phases - set(PHASES):
        raise SystemExit(f"unknown phases {sorted(phases - set(PHASES))}; known: {PHASES}")
    started = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {msg}", file=sys.stderr, flush=True)

    servers: list[RedisServer] = []
    # Turn SIGTERM into an exception so the finally block still kills the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        store = RedisServer("store").start()
        servers.append(store)
        broker = RedisServer("broker").start()
        servers.append(broker)
        log(f"store redis on :{store.port}, broker redis on :{broker.port}")
        cfg = Cfg(store_url=store.url(), broker_url=broker.url(), interval_s=args.interval_s,
                  cron_share=args.cron_share, batch_size=args.batch_size,
                  idle_ticks=args.idle_ticks, idle_sleep_s=args.idle_sleep_ms / 1000,
                  second_lead_ms=args.second_lead_ms, tracing=args.tracing)
        log("baseline: bare send_task")
        base = run_child(bare_send_task, cfg, args.baseline_messages, False)
        based = run_child(bare_send_task, cfg, args.baseline_messages, True)
        results = [bench_size(n, cfg, store, broker, phases, log) for n in sizes]
    finally:
        for server in servers:
            server.stop()
    table = render(results, base, based, cfg)
    print(table)
    print(f"\n(total {time.monotonic() - started:.0f}s; python {sys.version.split()[0]}, "
          f"{psutil.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.2f}; "
          f"tracing {'on' if args.tracing else 'off'})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"sizes": [asdict(r) for r in results], "baseline": base,
                       "baseline_batched": based, "cfg": asdict(cfg)}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
