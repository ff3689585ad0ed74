#!/usr/bin/env python
"""Benchmark the full cycle of celery-zsched against plain Celery, in the same run.

Usage::

    .venv/bin/python benchmarks/cycle.py [--jobs 5000] [--rounds 3] [--concurrency 2]
        [--broker amqp://guest:guest@127.0.0.1:5672//] [--floor] [--before DIR]
        [--quick] [--json out.json]

The variants run the same N executions of the same noop task, interleaved
(plain, zsched, plain, zsched, ...), each round with fresh processes:

* **plain**: one process publishes N messages with ``app.send_task`` through
  one reused producer, inside ``producer.batch()`` flushed every 1,000 messages
  (``benchmarks/bench.py``'s batched baseline; a beat's batch is 1,000 too). A
  real ``celery worker -P prefork -c 2`` consumes them. Plain Celery settles
  nothing: an execution is done when its task body has run.
* **zsched**: N jobs (interval one week, no jitter) stored due now with
  ``Store.upsert_many(..., stagger=False)``; a real ``celery beat -S
  celery_zsched`` claims and publishes them, and the same kind of prefork
  worker, whose app imports ``celery_zsched.worker`` (the start and settle
  hooks), runs them: claim -> publish -> start -> noop task -> settle. An
  execution is done when it is settled.

* **floor** (``--floor``): the least any design can cost that keeps DESIGN's
  two compare-and-sets per execution (a start before the body, a settle after
  it). Plain Celery's publisher and worker, whose pool children make exactly
  those two store round trips and nothing else: a Lua script that does nothing
  (``return 1``) before the body, waited for, and the same script when the body
  is done, sent without waiting and its reply read at the next start, as
  zsched's settle is (:mod:`celery_zsched.store.lane`). No hold, no state, no
  JSON. A real start and settle can only cost more, so ``floor / plain`` bounds
  from below what ``zsched / plain`` can reach.

* **before** (``--before DIR``): zsched again, its beat and worker importing the
  package from ``DIR`` (a git worktree of an earlier commit): a before/after
  comparison within one run, on the same box at the same time.

The workers run one app (this file: ``celery -A cycle:app``) with the same
settings; only the zsched variants import the hooks. The task is the same in
both: it INCRs a counter in a Redis of its own (the *marker*, neither store nor
broker), so the task costs the same in both variants and completion is seen the
same way without touching the servers being measured. zsched's settle runs
after the body; a zsched round therefore ends only when the store's
``complete`` counter reaches N as well (read once the marker has, so polling
costs the store a handful of HGETs, which are subtracted from its command
counts). The first publish is stamped in the marker by a ``before_task_publish``
receiver that disconnects itself after the first message, in the plain
publisher and in beat alike (beat's first claim, one script call for up to
1,000 jobs, comes just before it).

Beat is started on an empty store, and once it has announced itself (its
first tick ran) it is paused (SIGSTOP) while the jobs are stored; the baselines
are read, then it is resumed (SIGCONT). So neither beat's start-up nor the
import is counted; its idle ticks while the workers drain the queue are.

Reported per round: wall seconds from the first publish to the last execution
done, executions/s, CPU per execution (user + system, psutil) of the worker
tree (main process and pool children) and of beat (plain: of the publisher,
over its publishing), CPU per execution of the store and broker Redis servers
(INFO cpu deltas), and Redis commands per execution on the store and the
broker (INFO commandstats deltas, including the commands run inside Lua).
Then a markdown table of each variant's min and median and the zsched/plain
ratio of each metric.

Everything runs against throwaway ``redis-server`` processes on free ports
(store, broker and marker separate); 127.0.0.1:6379 is never used. With
``--broker amqp://...`` RabbitMQ is the broker (a queue of this run's own,
deleted at the end) and the broker columns are empty. Every process the script
starts is stopped at the end, also on error, SIGTERM or Ctrl-C.

This is a script, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import (
    FLEET_APP_CONF,
    CeleryFleet,
    Child,
    RedisServer,
    _redis_cpu_s,
    command_calls,
    command_delta,
    lazy_app,
)

PREFIX = "{cycle}:"
TASK = "cycle.noop"
WEEK_S = 7 * 86400.0  # each job fires once per round
VARIANTS = ("plain", "zsched", "floor", "before")
#: Messages per ``producer.batch()`` flush of the plain publisher (zsched_batch_size's default).
PUBLISH_BATCH = 1000
POLL_S = 0.005
#: Marker keys: executions done, the first publish (epoch s), workers ready.
DONE_KEY = "cycle:done"
FIRST_KEY = "cycle:first_publish"
READY_KEY = "cycle:ready"
#: Environment of the beat and worker processes.
ENV_VARIANT = "CYCLE_BENCH_VARIANT"
ENV_BROKER = "CYCLE_BENCH_BROKER_URL"
ENV_MARKER = "CYCLE_BENCH_MARKER_URL"
ENV_QUEUE = "CYCLE_BENCH_QUEUE"
ENV_FLOOR_STORE = "CYCLE_BENCH_FLOOR_STORE_URL"
ENV_BEFORE = "CYCLE_BENCH_BEFORE_DIR"
#: Put first on the ``before`` processes' path: an editable install of this
#: checkout answers every import of ``celery_zsched`` through its own finder,
#: ahead of ``PYTHONPATH``, so that finder is taken out before anything imports
#: the package (the ``celery`` command loads its entry points first).
BEFORE_SITECUSTOMIZE = """\
import sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if not getattr(f, "__module__", "").startswith("__editable__")]
"""
#: The floor's start and settle: a Lua script that does nothing.
FLOOR_SCRIPT = "return 1"


# ------------------------------------------------------------------ the app
def build_app(variant: str, broker_url: str, marker_url: str, queue: str) -> Any:
    """The Celery app of both variants; ``zsched`` also installs the worker hooks.

    The task INCRs ``DONE_KEY`` in the marker Redis. The marker client is made
    on first use in each process (a prefork child makes its own).
    """
    from celery import Celery, signals

    if variant in ("zsched", "before"):
        import celery_zsched.worker  # noqa: F401  (installs the start and settle hooks)
    if variant == "before":
        check_before_import()

    app = Celery("zsched_cycle_bench", broker=broker_url)
    if variant == "floor":
        install_floor(os.environ[ENV_FLOOR_STORE])
    app.conf.update(FLEET_APP_CONF, task_default_queue=queue)
    clients: list[redis.Redis] = []

    def marker() -> redis.Redis:
        if not clients:
            clients.append(redis.Redis.from_url(marker_url))
        return clients[0]

    @app.task(name=TASK)
    def noop(i: int) -> None:
        marker().incr(DONE_KEY)

    def first_publish(**_: Any) -> None:
        signals.before_task_publish.disconnect(first_publish)
        marker().set(FIRST_KEY, repr(time.time()), nx=True)

    def ready(sender: Any = None, **_: Any) -> None:
        marker().sadd(READY_KEY, str(getattr(sender, "hostname", os.getpid())))

    signals.before_task_publish.connect(first_publish, weak=False)
    signals.worker_ready.connect(ready, weak=False)
    return app


class FloorLane:
    """The floor's two round trips per execution, on one connection per process.

    ``start`` sends the script and reads every reply still unread (the last
    settle's, then its own): one round trip waited for. ``settle`` sends it and
    leaves the reply for the next start, as zsched's lane does.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: redis.Connection | None = None
        self.sha = ""
        self.unread = 0
        self.pid = 0

    def _connection(self) -> redis.Connection:
        if self.conn is None or self.pid != os.getpid():  # a forked child opens its own
            kwargs = redis.connection.parse_url(self.url)
            self.conn = redis.Connection(**kwargs)
            self.conn.connect()
            self.conn.send_command("SCRIPT", "LOAD", FLOOR_SCRIPT)
            self.sha = str(self.conn.read_response(), "ascii")
            self.unread, self.pid = 0, os.getpid()
        return self.conn

    def start(self) -> None:
        conn = self._connection()
        conn.send_command("EVALSHA", self.sha, 0)
        for _ in range(self.unread + 1):
            conn.read_response()
        self.unread = 0

    def settle(self) -> None:
        self._connection().send_command("EVALSHA", self.sha, 0)
        self.unread += 1


def install_floor(store_url: str) -> None:
    """Connect the floor's start (``task_prerun``, before the body, in the pool
    child) and settle (``task_success``, after it) to Celery's signals."""
    from celery import signals

    lane = FloorLane(store_url)
    signals.task_prerun.connect(lambda **_: lane.start(), weak=False)
    signals.task_success.connect(lambda **_: lane.settle(), weak=False)


def before_env(checkout: str, workdir: str) -> dict[str, str]:
    """The environment under which a process imports ``celery_zsched`` from ``checkout``
    (and this directory's modules), even with this checkout installed editable."""
    site = Path(workdir) / "before-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BEFORE_SITECUSTOMIZE)
    return {"PYTHONPATH": os.pathsep.join([str(site), checkout, str(Path(__file__).parent)]),
            ENV_BEFORE: checkout}


def check_before_import() -> None:
    """In a process started under :func:`before_env`: raise unless ``celery_zsched``
    came from that checkout (a before/after run must never compare a commit with itself)."""
    import celery_zsched

    where = Path(celery_zsched.__file__).resolve()
    if not where.is_relative_to(Path(os.environ[ENV_BEFORE]).resolve()):
        raise RuntimeError(f"the before variant imported celery_zsched from {where}, "
                           f"not from {os.environ[ENV_BEFORE]}")


def _app_from_env() -> Any:
    return build_app(os.environ[ENV_VARIANT], os.environ[ENV_BROKER], os.environ[ENV_MARKER],
                     os.environ[ENV_QUEUE])


#: ``cycle.app`` for ``celery -A cycle:app`` (beat and workers), built on first use.
__getattr__ = lazy_app(_app_from_env)


def publish_plain(broker_url: str, marker_url: str, queue: str, n: int, ready: Any,
                  go: Any) -> dict[str, float]:
    """The plain variant's publisher: N ``send_task`` through one producer, batched.

    Runs in a spawned process: builds the app, sets ``ready``, waits for ``go``,
    publishes. Returns its CPU seconds and wall seconds over the publishing.
    """
    app = build_app("plain", broker_url, marker_url, queue)
    producer = app.amqp.Producer(app.connection_for_write(), auto_declare=False)
    send = app.send_task
    kwargs = [{"i": i} for i in range(n)]
    ready.set()
    go.wait()
    cpu, started = time.process_time(), time.perf_counter()
    for start in range(0, n, PUBLISH_BATCH):
        with producer.batch(max_size=PUBLISH_BATCH):
            for each in kwargs[start:start + PUBLISH_BATCH]:
                send(TASK, kwargs=each, producer=producer)
    return {"cpu_s": time.process_time() - cpu, "seconds": time.perf_counter() - started}


# ---------------------------------------------------------------- the rounds
@dataclass
class Ctx:
    """This run's servers, settings and log."""

    args: argparse.Namespace
    store: RedisServer
    marker: RedisServer
    broker: RedisServer | None
    broker_url: str
    queue: str
    logdir: str
    log: Callable[[str], None]
    #: A :class:`~celery_zsched.store.Store` on the store server, and a client of the marker.
    zstore: Any = field(init=False)
    marker_client: redis.Redis = field(init=False)
    broker_client: redis.Redis | None = field(init=False)

    def __post_init__(self) -> None:
        from celery_zsched.config import Settings
        from celery_zsched.store import Store

        self.zstore = Store.from_settings(Settings(redis_url=self.store.url(),
                                                   key_prefix=PREFIX))
        self.marker_client = self.marker.client()
        self.broker_client = self.broker.client() if self.broker is not None else None

    def reset(self) -> None:
        for server in (self.store, self.marker, self.broker):
            if server is not None:
                server.client().flushall()

    def fleet(self, variant: str, rnd: int) -> CeleryFleet:
        env = {ENV_VARIANT: variant, ENV_BROKER: self.broker_url,
               ENV_MARKER: self.marker.url(), ENV_QUEUE: self.queue}
        if variant == "floor":
            env[ENV_FLOOR_STORE] = self.store.url()
        if variant in ("zsched", "before"):
            env.update(ZSCHED_REDIS_URL=self.store.url(), ZSCHED_KEY_PREFIX=PREFIX)
        if variant == "before":  # its beat and worker import that checkout's package
            env.update(before_env(self.args.before, self.logdir))
        return CeleryFleet("cycle:app", self.logdir, f"{variant}{rnd}", env,
                           drop=("CYCLE_BENCH_",))

    def sample(self, fleet: CeleryFleet, store: bool) -> dict[str, Any]:
        """CPU seconds of the processes and servers, and the servers' command counts
        (the store's only when ``store``: plain Celery has none)."""
        cpu = fleet.cpu_s()
        out = {"workers": cpu["workers"], "beat": cpu["beat"]}
        for name, server, client in (("store", self.store if store else None, self.zstore.client),
                                     ("broker", self.broker, self.broker_client)):
            if server is not None:
                out[f"{name}_cpu"] = _redis_cpu_s(client)
                out[f"{name}_cmds"] = command_calls(client)
        return out

    def wait_done(self, n: int, fleet: CeleryFleet, settled: bool) -> tuple[float, int]:
        """Poll until N executions ran (and, ``settled``, N settled); the time then
        (epoch s) and the HGETs spent on the store's counters."""
        deadline = time.monotonic() + self.args.timeout_s
        checks = [(lambda: self.marker_client.get(DONE_KEY), "ran")]
        if settled:
            checks.append((lambda: self.zstore.client.hget(self.zstore.keys.counters,
                                                           "complete"), "settled"))
        polls = 0
        for read, what in checks:
            while True:
                polls += what == "settled"
                got = int(read() or 0)
                if got >= n:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{got:,} of {n:,} {what} in {self.args.timeout_s:g} s; "
                                       f"logs in {self.logdir}")
                fleet.check_alive()
                time.sleep(POLL_S)
        return time.time(), polls

    def wait_store_calls(self, before: Any, calls: int) -> None:
        """Poll until the store has run ``calls`` EVALSHA since ``before``."""
        deadline = time.monotonic() + self.args.timeout_s
        while command_delta(before, command_calls(self.zstore.client))["evalsha"] < calls:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the store did not see {calls:,} script calls")
            time.sleep(POLL_S)

    def result(self, variant: str, rnd: int, n: int, before: dict[str, Any],
               after: dict[str, Any], end: float, polls: int) -> dict[str, Any]:
        """One round's numbers, from the samples around it."""
        first = float(self.marker_client.get(FIRST_KEY) or "nan")
        out: dict[str, Any] = {
            "variant": variant, "round": rnd, "n": n, "wall_s": end - first,
            "rate": n / (end - first),
            "ran": int(self.marker_client.get(DONE_KEY) or 0),
            "worker_cpu_s": after["workers"] - before["workers"],
            "beat_cpu_s": after["beat"] - before["beat"],
            "counters": {k: int(v) for k, v in
                         self.zstore.client.hgetall(self.zstore.keys.counters).items()},
        }
        for name in ("store", "broker"):
            out[f"{name}_cpu_s"] = out[f"{name}_cmds"] = None
            if f"{name}_cmds" in before:
                cmds = command_delta(before[f"{name}_cmds"], after[f"{name}_cmds"])
                if name == "store":
                    cmds["hget"] -= polls  # the completion polls are not the cycle's
                out[f"{name}_cpu_s"] = after[f"{name}_cpu"] - before[f"{name}_cpu"]
                out[f"{name}_cmds"] = dict((+cmds).most_common())
        return out


def plain_round(ctx: Ctx, rnd: int, n: int, variant: str = "plain") -> dict[str, Any]:
    """A prefork worker; a publisher process sends N messages; wait for N executions.

    ``variant="floor"``: the worker's children make the floor's two store round
    trips per execution, and the store's CPU and commands are counted."""
    floor = variant == "floor"
    ctx.reset()
    fleet = ctx.fleet(variant, rnd)
    publisher: Child | None = None
    try:
        fleet.start_worker("cycle", ctx.args.concurrency)
        fleet.wait_ready(ctx.marker_client, READY_KEY, 1)
        mpc = mp.get_context("spawn")
        ready, go = mpc.Event(), mpc.Event()
        publisher = Child(publish_plain, ctx.broker_url, ctx.marker.url(), ctx.queue, n,
                          ready, go)
        if not ready.wait(120):
            raise TimeoutError("the plain publisher did not get ready within 120 s")
        before = ctx.sample(fleet, store=floor)
        go.set()
        end, polls = ctx.wait_done(n, fleet, settled=False)
        if floor:  # the last settle was sent after its task's body counted it done
            ctx.wait_store_calls(before["store_cmds"], 2 * n)
        after = ctx.sample(fleet, store=floor)
        published = publisher.result(60)
        out = ctx.result(variant, rnd, n, before, after, end, polls)
    finally:
        if publisher is not None:
            publisher.stop()
        fleet.stop()
    out["beat_cpu_s"] = published["cpu_s"]
    out["publish_s"] = published["seconds"]
    return out


def zsched_round(ctx: Ctx, rnd: int, n: int, variant: str = "zsched") -> dict[str, Any]:
    """A prefork worker and a beat; N jobs stored due now; wait for N settles."""
    from celery_zsched.core.job import Job

    ctx.reset()
    fleet = ctx.fleet(variant, rnd)
    store = ctx.zstore
    try:
        fleet.start_worker("cycle", ctx.args.concurrency)
        fleet.wait_ready(ctx.marker_client, READY_KEY, 1)
        fleet.start_beat()
        deadline = time.monotonic() + 120
        while not store.client.zcard(store.base.beats):  # beat's first tick announces it
            fleet.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError("beat did not tick within 120 s")
            time.sleep(0.05)
        fleet.send_signal("beat", signal.SIGSTOP)
        jobs = [Job.from_dict({"id": f"r{rnd}-{i}", "task": TASK, "kwargs": {"i": i},
                               "interval_s": WEEK_S, "jitter_s": 0}, store.defaults, row=i)
                for i in range(n)]
        created = store.upsert_many(jobs, stagger=False, total=n).created
        before = ctx.sample(fleet, store=True)
        fleet.send_signal("beat", signal.SIGCONT)
        end, polls = ctx.wait_done(n, fleet, settled=True)
        after = ctx.sample(fleet, store=True)
        out = ctx.result(variant, rnd, n, before, after, end, polls)
    finally:
        fleet.stop()
    out["created"] = created
    return out


def drop_amqp_queue(broker_url: str, queue: str) -> None:
    """Delete this run's queue on a RabbitMQ broker (a shared server keeps no leftovers)."""
    from kombu import Connection

    with contextlib.suppress(Exception), Connection(broker_url) as conn:
        conn.default_channel.queue_delete(queue)


# -------------------------------------------------------------------- table
@dataclass(frozen=True)
class Metric:
    label: str
    fmt: str
    value: Callable[[dict[str, Any]], float | None]


def _per_exec_ms(key: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda r: None if r[key] is None else r[key] / r["n"] * 1000


def _total_ms(r: dict[str, Any]) -> float:
    parts = ("worker_cpu_s", "beat_cpu_s", "store_cpu_s", "broker_cpu_s")
    return sum(r[k] or 0.0 for k in parts) / r["n"] * 1000


def _cmds(key: str, name: str = "") -> Callable[[dict[str, Any]], float | None]:
    def per_exec(r: dict[str, Any]) -> float | None:
        cmds = r[key]
        if cmds is None:
            return None
        return (cmds.get(name, 0) if name else sum(cmds.values())) / r["n"]
    return per_exec


METRICS = [
    Metric("wall s, first publish -> last execution done", ".2f", lambda r: r["wall_s"]),
    Metric("executions/s", ",.0f", lambda r: r["rate"]),
    Metric("worker-tree CPU ms/execution", ".3f", _per_exec_ms("worker_cpu_s")),
    Metric("beat CPU ms/execution (plain: the publisher)", ".3f", _per_exec_ms("beat_cpu_s")),
    Metric("store Redis CPU ms/execution", ".3f", _per_exec_ms("store_cpu_s")),
    Metric("broker Redis CPU ms/execution", ".3f", _per_exec_ms("broker_cpu_s")),
    Metric("total CPU ms/execution (worker + beat + store + broker)", ".3f", _total_ms),
    Metric("store Redis commands/execution (incl. inside Lua)", ".2f", _cmds("store_cmds")),
    Metric("store EVALSHA/execution (script calls)", ".2f", _cmds("store_cmds", "evalsha")),
    Metric("broker Redis commands/execution", ".2f", _cmds("broker_cmds")),
]


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _counted(r: dict[str, Any]) -> str:
    if r["variant"] not in ("zsched", "before"):
        return f"{r['ran']:,} ran"
    c = r["counters"]
    return (f"{r['ran']:,} ran, {c.get('complete', 0):,} settled, "
            f"{c.get('duplicates', 0):,} duplicates")


def render_rounds(rounds: list[dict[str, Any]]) -> str:
    head = ["round", "variant", *(m.label for m in METRICS), "executions counted"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rounds:
        cells = [str(r["round"]), r["variant"], *(_f(m.value(r), m.fmt) for m in METRICS),
                 _counted(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summarize(rounds: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Per metric and variant: the min and the median over the rounds."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for m in METRICS:
        out[m.label] = {}
        for variant in VARIANTS:
            values = [v for r in rounds if r["variant"] == variant
                      if (v := m.value(r)) is not None]
            out[m.label][variant] = {"min": min(values) if values else None,
                                     "median": statistics.median(values) if values else None}
    return out


def _ratio(mine: float | None, base: float | None) -> str:
    return "-" if mine is None or not base else f"{mine / base:.2f}x"


def render_summary(summary: dict[str, dict[str, dict[str, float | None]]]) -> str:
    """Each variant's min and median, and its ratio to plain (the floor's only when it ran)."""
    first = next(iter(summary.values()))
    shown = [v for v in VARIANTS
             if first[v]["median"] is not None or v not in ("floor", "before")]
    head = ["metric", *(f"{v} {stat}" for v in shown for stat in ("min", "median")),
            *(f"{v}/plain ({stat})" for v in shown[1:] for stat in ("medians", "mins"))]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in METRICS:
        got = summary[m.label]
        cells = [m.label, *(_f(got[v][stat], m.fmt) for v in shown for stat in ("min", "median")),
                 *(_ratio(got[v][stat], got["plain"][stat]) for v in shown[1:]
                   for stat in ("median", "min"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def versions() -> str:
    found = [f"python {platform.python_version()}"]
    for dist in ("celery-zsched", "celery", "kombu", "redis"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found.append(f"{dist} {metadata.version(dist)}")
    return ", ".join(found)


# --------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--jobs", type=int, help="executions per round, N (default 5,000)")
    p.add_argument("--rounds", type=int, help="rounds of each variant, interleaved (default 3)")
    p.add_argument("--concurrency", type=int, default=2,
                   help="prefork children of the worker (default 2)")
    p.add_argument("--broker", default="",
                   help="broker URL, e.g. amqp://guest:guest@127.0.0.1:5672// "
                        "(default: a throwaway redis-server)")
    p.add_argument("--timeout-s", type=float, default=300.0,
                   help="longest a round may wait for its executions (default 300)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: N = 500, 1 round (options given explicitly still win)")
    p.add_argument("--floor", action="store_true",
                   help="also run the floor: plain Celery plus two empty store round trips "
                        "per execution (the least a start and a settle can cost)")
    p.add_argument("--before", default="",
                   help="also run zsched from this checkout (a git worktree of an earlier "
                        "commit), interleaved: a before/after comparison in one run")
    p.add_argument("--json", help="also write raw results to this file")
    args = p.parse_args(argv)
    if args.jobs is None:
        args.jobs = 500 if args.quick else 5_000
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    return args


def run(args: argparse.Namespace, log: Callable[[str], None], logdir: str
        ) -> tuple[list[dict[str, Any]], str]:
    servers: list[RedisServer] = []
    queue = f"cycle-bench-{os.getpid()}"
    broker_url = args.broker
    try:
        store = RedisServer("store").start()
        servers.append(store)
        marker = RedisServer("marker").start()
        servers.append(marker)
        broker = None
        if not broker_url:
            broker = RedisServer("broker").start()
            servers.append(broker)
            broker_url = broker.url()
        ctx = Ctx(args, store, marker, broker, broker_url, queue, logdir, log)
        log(f"store redis :{store.port}, marker redis :{marker.port}, broker "
            f"{f'redis :{broker.port}' if broker else broker_url}; logs in {logdir}")
        rounds = []
        variants: list[tuple[str, Callable[[Ctx, int, int], dict[str, Any]]]] = [
            ("plain", plain_round), ("zsched", zsched_round)]
        if args.floor:
            variants.append(("floor", lambda c, r, n: plain_round(c, r, n, "floor")))
        if args.before:
            variants.append(("before", lambda c, r, n: zsched_round(c, r, n, "before")))
        for rnd in range(1, args.rounds + 1):
            for variant, fn in variants:
                res = fn(ctx, rnd, args.jobs)
                log(f"round {rnd} {variant}: {res['wall_s']:.2f} s, {res['rate']:,.0f}/s, "
                    f"worker {res['worker_cpu_s'] / args.jobs * 1000:.3f} ms/execution; "
                    f"{_counted(res)}")
                rounds.append(res)
    finally:
        if broker_url.startswith("amqp"):
            drop_amqp_queue(broker_url, queue)
        for server in servers:
            server.stop()
    return rounds, "redis (throwaway)" if not args.broker else args.broker


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {msg}", file=sys.stderr, flush=True)

    # Turn SIGTERM into an exception so the finally blocks stop every process.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logdir = tempfile.mkdtemp(prefix="zsched-cycle-bench-")
    rounds, broker = run(args, log, logdir)
    shutil.rmtree(logdir, ignore_errors=True)  # kept (and named) only when a round failed
    summary = summarize(rounds)
    print(f"Full cycle, N = {args.jobs:,} executions per round, {args.rounds} round(s) of "
          f"each variant, interleaved; prefork worker -c {args.concurrency}; broker {broker}; "
          f"plain publishes with send_task in producer.batch() ({PUBLISH_BATCH} per flush).")
    print(f"Versions: {versions()}. Machine: {psutil.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f} at the end.\n")
    print(render_rounds(rounds))
    print()
    print(render_summary(summary))
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "versions": versions(), "rounds": rounds,
                       "summary": summary}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
