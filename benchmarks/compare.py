#!/usr/bin/env python
"""Run celery-zsched, celery-redbeat and django-celery-beat side by side on the same work.

Usage::

    python benchmarks/compare.py [--sizes 10000,100000] [--only zsched,redbeat,dcb]
                                 [--steps load,idle,storm,multi,late,second]
                                 [--timeout-s 120] [--json out.json]

Each scheduler is used the way its own documentation says:

* **zsched**: jobs validated with ``Job.from_dict`` and stored with
  ``Store.upsert_many`` (what ``celery_zsched.core.formats`` does); beat is
  ``-S celery_zsched`` (``ZSchedScheduler``).
* **redbeat**: ``RedBeatSchedulerEntry(...).save()`` per entry; beat is
  ``redbeat.RedBeatScheduler`` with its lock (taken on ``beat_init``).
* **dcb** (django-celery-beat): ``PeriodicTask`` rows on one ``IntervalSchedule``
  in PostgreSQL (a throwaway database on 127.0.0.1:5432, or SQLite with
  ``--dcb-db sqlite``), written with ``bulk_create`` and then
  ``PeriodicTasks.update_changed()`` as its README says for bulk changes; beat is
  ``django_celery_beat.schedulers:DatabaseScheduler``.

Every beat runs as ``celery beat`` runs it: a spawned process builds
``celery.beat.Service(app, scheduler_cls=app.conf.beat_scheduler)`` and calls
``Service.start()``, which sends ``beat_init`` and loops on ``tick()``, sleeping
what each tick returns, with each scheduler's own default ``max_interval``. Only the
idle step drives ``tick()`` itself (back to back, 1 ms apart) to time single ticks.

Publishes are counted on the broker, a throwaway ``redis-server``: the parent
polls the queue's length and afterwards reads every message back and names the
entry it belongs to (each entry's kwargs carry its name), so duplicates and
missing entries are counted there, never in the scheduler. Schedules live in a
second throwaway ``redis-server`` (zsched, redbeat) or in the database (dcb).
127.0.0.1:6379 is never used; everything started is stopped at the end, also
on error, SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import contextlib
import gc
import importlib.metadata
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import RedisServer, RoundTrips, child_main, command_calls, command_delta

MiB = 1024 * 1024
KINDS = ("zsched", "redbeat", "dcb")
STEPS = ("load", "idle", "storm", "multi", "late", "second")
QUEUE = "celery"  # Celery's default queue: every benchmark entry is routed there
TASK = "bench.noop"  # never run: no worker consumes the queue
WEEK_S = 7 * 86400  # the interval of every entry: each fires at most once per run
ZSCHED_PREFIX = "{cmp}:"
REDBEAT_SCHEDULE_KEY = "redbeat::schedule"
SCHEDULER_CLS = {
    "zsched": "celery_zsched",
    "redbeat": "redbeat.RedBeatScheduler",
    "dcb": "django_celery_beat.schedulers:DatabaseScheduler",
}
READY_TIMEOUT_S = 120.0
Result = dict[str, Any]


# --------------------------------------------------------------------- config
@dataclass(frozen=True)
class Env:
    """What a child process needs to act as one scheduler on this run's servers."""

    kind: str
    store_url: str
    store_port: int
    broker_url: str
    dcb_db: dict[str, Any] | None = None
    idle_ticks: int = 200
    idle_budget_s: float = 20.0
    idle_sleep_s: float = 0.001


@dataclass(frozen=True)
class Plan:
    """``n`` entries named ``{tag}-{i}``; entry ``i`` is due at ``first_due + spread * i / n``."""

    n: int
    first_due: float
    spread_s: float
    tag: str

    def name(self, i: int) -> str:
        return f"{self.tag}-{i:07d}"

    def due(self, i: int) -> float:
        return self.first_due + (self.spread_s * i / self.n if self.n else 0.0)

    def items(self) -> Iterator[tuple[str, float]]:
        for i in range(self.n):
            yield self.name(i), self.due(i)


def rss_mib() -> float:
    return float(psutil.Process().memory_info().rss) / MiB


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, timezone.utc)


# ------------------------------------------------------- the three schedulers
def setup_django(env: Env) -> None:
    """Configure Django for django-celery-beat (once per process)."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            DATABASES={"default": env.dcb_db}, INSTALLED_APPS=["django_celery_beat"],
            USE_TZ=True, TIME_ZONE="UTC", DEFAULT_AUTO_FIELD="django.db.models.AutoField")
        django.setup()


def make_app(env: Env) -> Any:
    """A Celery app on the throwaway broker, configured for ``env.kind``."""
    from celery import Celery

    app = Celery("compare", broker=env.broker_url)
    conf: dict[str, Any] = {
        "timezone": "UTC", "enable_utc": True, "beat_schedule": {},
        "broker_connection_retry_on_startup": False,
        "beat_scheduler": SCHEDULER_CLS[env.kind],
    }
    if env.kind == "zsched":
        # No worker runs: lift the backpressure bound (10 x batch by default), or
        # zsched would stop publishing at 10,000 waiting messages by design.
        conf.update(zsched_redis_url=env.store_url, zsched_key_prefix=ZSCHED_PREFIX,
                    zsched_max_queued=100_000_000)
    elif env.kind == "redbeat":
        conf.update(redbeat_redis_url=env.store_url)
    else:
        setup_django(env)
    app.conf.update(conf)
    return app


def load_zsched(env: Env, plan: Plan) -> Result:
    """Validate rows with ``Job.from_dict``, store them with one ``upsert_many``."""
    from celery_zsched.config import Settings
    from celery_zsched.core.job import Defaults, Job
    from celery_zsched.store import Store

    settings = Settings(redis_url=env.store_url, key_prefix=ZSCHED_PREFIX)
    store = Store.from_settings(settings)
    defaults = Defaults.from_settings(settings)
    store.now_ms()  # connect outside the timing
    rows = [{"id": name, "task": TASK, "kwargs": {"entry": name}, "interval_s": WEEK_S}
            for name, _ in plan.items()]
    first_due: dict[str, int | None] = {name: round(due * 1000) for name, due in plan.items()}
    gc.disable()  # as the importer does while validating
    try:
        started = time.perf_counter()
        jobs = [Job.from_dict(row, defaults, row=i) for i, row in enumerate(rows)]
    finally:
        gc.enable()
    store.upsert_many(jobs, stagger=False, total=len(jobs), first_due=first_due)
    seconds = time.perf_counter() - started
    store.client.close()
    return {"seconds": seconds}


def load_redbeat(env: Env, plan: Plan) -> Result:
    """``RedBeatSchedulerEntry(...).save()`` per entry, as redbeat's README does.

    Each entry is saved as redbeat itself saves it right after a run at
    ``last_run_at``: its schedule's clock reads ``last_run_at`` while ``save()``
    computes the score (the clock is not stored). With the real clock, redbeat's
    ``due_at`` (``last_run_at`` + the time from *now* to the next run) puts an
    entry saved with a past ``last_run_at`` too early in the sorted set, and every
    tick would then load it until it really falls due.
    """
    from celery.schedules import schedule
    from redbeat import RedBeatSchedulerEntry

    app = make_app(env)
    run_every = timedelta(seconds=WEEK_S)
    items = [(name, utc(due - WEEK_S)) for name, due in plan.items()]
    warm = schedule(run_every=run_every, app=app)
    RedBeatSchedulerEntry("warm-up", TASK, warm, app=app).delete()  # connect, untimed
    started = time.perf_counter()
    for name, last_run_at in items:
        every = schedule(run_every=run_every, nowfun=_frozen(last_run_at), app=app)
        RedBeatSchedulerEntry(name, TASK, every, kwargs={"entry": name}, app=app,
                              last_run_at=last_run_at).save()
    return {"seconds": time.perf_counter() - started}


def load_dcb(env: Env, plan: Plan) -> Result:
    """``PeriodicTask`` rows by ``bulk_create``, then ``PeriodicTasks.update_changed()``."""
    setup_django(env)
    from django.db import transaction
    from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks

    every, _ = IntervalSchedule.objects.get_or_create(every=WEEK_S,
                                                      period=IntervalSchedule.SECONDS)
    items = [(name, json.dumps({"entry": name}), utc(due - WEEK_S)) for name, due in plan.items()]
    started = time.perf_counter()
    with transaction.atomic():
        PeriodicTask.objects.bulk_create(
            [PeriodicTask(name=name, task=TASK, interval=every, kwargs=kwargs,
                          last_run_at=last_run_at) for name, kwargs, last_run_at in items],
            batch_size=1000)
    PeriodicTasks.update_changed()
    return {"seconds": time.perf_counter() - started}


def _frozen(at: datetime) -> Callable[[], datetime]:
    return lambda: at


LOADERS: dict[str, Callable[[Env, Plan], Result]] = {
    "zsched": load_zsched, "redbeat": load_redbeat, "dcb": load_dcb}


def dcb_migrate(env: Env) -> None:
    """Create django-celery-beat's tables (run once, on the template database)."""
    setup_django(env)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


# ----------------------------------------------------------- child processes
_LIVE: list[Any] = []  # every spawned process not yet reaped: killed on the way out


class Timeout(Exception):
    """A child did not answer within its step's time limit."""


def _receive(conn: Connection, what: str, timeout: float) -> Any:
    if not conn.poll(timeout):
        raise Timeout(f"{what}: no answer within {timeout:.0f}s")
    try:
        status, value = conn.recv()
    except EOFError:
        raise RuntimeError(f"{what}: the child process died without an answer") from None
    if status != "ok":
        raise RuntimeError(f"{what} failed in the child process:\n{value}")
    return value


def reap(proc: Any, grace_s: float = 10.0) -> None:
    """SIGTERM (a beat syncs and closes on it), then SIGKILL after ``grace_s``."""
    if proc.is_alive():
        proc.terminate()
        proc.join(grace_s)
    if proc.is_alive():
        proc.kill()
        proc.join(5)
    if proc in _LIVE:
        _LIVE.remove(proc)


def run_child(timeout: float, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a fresh spawned process; :class:`Timeout` after ``timeout``."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=child_main, args=(fn, args, child), daemon=True)
    proc.start()
    _LIVE.append(proc)
    child.close()
    try:
        return _receive(parent, fn.__name__, timeout)
    finally:
        reap(proc)


# ---------------------------------------------------------------- idle beat
class SqlCounter:
    """Counts SQL statements Django sends (``connection.execute_wrapper``)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool,
                 context: Any) -> Any:
        self.count += 1
        return execute(sql, params, many, context)


def idle_beat(env: Env) -> Result:
    """Build the scheduler as ``Service`` does, send ``beat_init``, then time idle ticks.

    Ticks run back to back (``idle_sleep_s`` apart) rather than honouring the
    returned sleep, to sample many ticks; each tick's cost is the same either way.
    """
    from celery import signals
    from celery.beat import Service

    app = make_app(env)
    service = Service(app, scheduler_cls=app.conf.beat_scheduler)
    started = time.perf_counter()
    sched = service.scheduler  # dcb reads every row here; the others connect lazily
    signals.beat_init.send(sender=service)  # redbeat takes its lock here
    sched.tick()
    startup_s = time.perf_counter() - started
    monitor = redis.Redis.from_url(env.store_url)
    sql = SqlCounter()
    with contextlib.ExitStack() as stack:
        if env.kind == "dcb":
            from django.db import connection

            stack.enter_context(connection.execute_wrapper(sql))
        trips = stack.enter_context(RoundTrips(env.store_port))
        before = command_calls(monitor)
        times = _time_ticks(sched, env)
        calls = command_delta(before, command_calls(monitor))
    service.sync()  # closes the scheduler (redbeat releases its lock)
    ticks = len(times)
    times_ms = sorted(t * 1000 for t in times)
    out: Result = {
        "startup_s": startup_s, "ticks": ticks, "p50_ms": statistics.median(times_ms),
        "p99_ms": times_ms[min(ticks - 1, int(ticks * 0.99))], "max_ms": times_ms[-1],
        "rss_mib": rss_mib(), "max_interval": sched.max_interval,
    }
    if env.kind == "dcb":
        out["sql_per_tick"] = sql.count / ticks
    else:
        out["cmds_per_tick"] = sum(calls.values()) / ticks
        out["round_trips_per_tick"] = trips.count / ticks
    return out


def _time_ticks(sched: Any, env: Env) -> list[float]:
    times: list[float] = []
    clock = time.perf_counter
    budget_end = clock() + env.idle_budget_s
    for _ in range(env.idle_ticks):
        time.sleep(env.idle_sleep_s)
        t0 = clock()
        sched.tick()
        t1 = clock()
        times.append(t1 - t0)
        if t1 > budget_end and len(times) >= 5:
            break
    return times


# ------------------------------------------------------------- serving beat
def _on_sigterm(*_: object) -> None:
    raise SystemExit(0)


def serve_beat(env: Env, go: Any, conn: Connection) -> None:
    """A beat as ``celery beat`` runs it: ``Service.start()`` once the parent says go.

    Everything that ``celery beat`` does before its loop (imports, app, Django)
    happens before go; building the scheduler is part of ``start()``.
    SIGTERM ends the loop the way it ends ``celery beat`` (sync, close, lock released).
    """
    try:
        from celery.beat import Service
        from celery.utils.imports import symbol_by_name
        from kombu.utils.objects import cached_property  # noqa: F401  (warm import)

        app = make_app(env)
        if env.kind != "zsched":
            symbol_by_name(SCHEDULER_CLS[env.kind])
        service = Service(app, scheduler_cls=app.conf.beat_scheduler)
        signal.signal(signal.SIGTERM, _on_sigterm)
        conn.send(("ok", {"pid": os.getpid()}))
        go.wait()
        service.start()
        conn.send(("ok", {"rss_mib": rss_mib()}))
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(("err", traceback.format_exc()))


# ---------------------------------------------------------- broker watching
@dataclass
class Watch:
    """What the broker saw: (wall time, queue length) whenever the length changed."""

    samples: list[tuple[float, int]] = field(default_factory=list)
    timed_out: bool = False
    beats_died: bool = False
    _lens: list[int] = field(default_factory=list)

    def arrival(self, ordinal: int) -> float:
        """When message number ``ordinal`` (0 = first published) was first seen."""
        if len(self._lens) != len(self.samples):
            self._lens = [n for _, n in self.samples]
        return self.samples[bisect.bisect_right(self._lens, ordinal)][0]


def watch_broker(broker: redis.Redis, expected: int, deadline: float, settle_s: float,
                 poll_s: float, procs: list[Any]) -> Watch:
    """Poll LLEN until ``expected`` messages are in and nothing moved for ``settle_s``.

    Stops at ``deadline`` (timed out) or when every beat process has exited.
    """
    watch = Watch(samples=[(time.time(), 0)])
    last_len, last_change = 0, time.time()
    while True:
        length = int(broker.llen(QUEUE))
        now = time.time()
        if length != last_len:
            watch.samples.append((now, length))
            last_len, last_change = length, now
        if length >= expected and now - last_change >= settle_s:
            return watch
        if now >= deadline:
            watch.timed_out = True
            return watch
        if not any(p.is_alive() for p in procs):
            watch.beats_died = True
            return watch
        time.sleep(poll_s)


def entry_of(raw: bytes | str) -> str | None:
    """The entry name a Celery protocol 2 message carries in its kwargs (None: not ours)."""
    msg = json.loads(raw)
    if msg["headers"].get("task") != TASK:
        return None
    _args, kwargs, _embed = json.loads(base64.b64decode(msg["body"]))
    name = kwargs.get("entry")
    return name if isinstance(name, str) else None


def read_broker(broker: redis.Redis, watch: Watch) -> dict[str, list[float]]:
    """Every bench message in the queue, oldest first: entry name -> arrival times."""
    length = int(broker.llen(QUEUE))
    if length != watch.samples[-1][1]:
        watch.samples.append((time.time(), length))
    seen: dict[str, list[float]] = {}
    step = 20_000
    for stop in range(length, 0, -step):  # LPUSH: index 0 is the newest message
        chunk = broker.lrange(QUEUE, max(0, stop - step), stop - 1)
        for offset, raw in enumerate(reversed(chunk)):
            name = entry_of(raw)
            if name is not None:
                seen.setdefault(name, []).append(watch.arrival(length - stop + offset))
    return seen


def tally(plan: Plan, seen: dict[str, list[float]]) -> Result:
    """Distinct, duplicate and missing entries, and when the first/last new one arrived."""
    expected = {plan.name(i) for i in range(plan.n)}
    firsts = {name: min(times) for name, times in seen.items() if name in expected}
    messages = sum(len(times) for name, times in seen.items() if name in expected)
    return {
        "distinct": len(firsts), "messages": messages,
        "duplicates": messages - len(firsts), "missing": plan.n - len(firsts),
        "strangers": sum(len(t) for name, t in seen.items() if name not in expected),
        "first_at": min(firsts.values(), default=None),
        "last_at": max(firsts.values(), default=None), "firsts": firsts,
    }


# ------------------------------------------------------------ test harness
class DcbDatabases:
    """Throwaway django-celery-beat databases: one migrated template, a clone per step."""

    def __init__(self, backend: str, dsn: str) -> None:
        self.backend = backend
        self.dsn = dsn
        self.tag = f"zsched_cmp_{os.getpid()}"
        self.created: list[str] = []
        self.dir = tempfile.mkdtemp(prefix="zsched-compare-dcb-")
        self.template: dict[str, Any] | None = None
        self.conn_max_age = 0

    def _admin(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)

    def settings(self, name: str) -> dict[str, Any]:
        if self.backend == "sqlite":
            return {"ENGINE": "django.db.backends.sqlite3",
                    "NAME": os.path.join(self.dir, f"{name}.sqlite3")}
        import psycopg

        info = psycopg.conninfo.conninfo_to_dict(self.dsn)
        return {"ENGINE": "django.db.backends.postgresql", "NAME": name,
                "HOST": info.get("host", "127.0.0.1"), "PORT": str(info.get("port", 5432)),
                "USER": info.get("user", "postgres"), "PASSWORD": info.get("password", ""),
                "CONN_MAX_AGE": self.conn_max_age}

    def _create(self, name: str, template: str | None = None) -> dict[str, Any]:
        if self.backend == "postgres":
            with self._admin() as admin:
                self.created.append(name)
                admin.execute(f'CREATE DATABASE "{name}"'
                              + (f' TEMPLATE "{template}"' if template else ""))
        elif template:
            shutil.copyfile(self.settings(template)["NAME"], self.settings(name)["NAME"])
        return self.settings(name)

    def fresh(self, env_for: Callable[[dict[str, Any]], Env], step: str) -> dict[str, Any]:
        """A migrated, empty database for one step (cloned from the template)."""
        if self.template is None:
            db = self._create(f"{self.tag}_tpl")
            run_child(300, dcb_migrate, env_for(db))
            self.template = db
        return self._create(f"{self.tag}_{step}_{len(self.created)}", self.template["NAME"]
                            if self.backend == "postgres" else f"{self.tag}_tpl")

    def count(self, db: dict[str, Any]) -> int:
        query = "SELECT count(*) FROM django_celery_beat_periodictask WHERE task = %s"
        if self.backend == "sqlite":
            with contextlib.closing(sqlite3.connect(db["NAME"])) as lite:
                return int(lite.execute(query.replace("%s", "?"), (TASK,)).fetchone()[0])
        import psycopg

        with psycopg.connect(self.dsn, dbname=db["NAME"], autocommit=True) as conn:
            row = conn.execute(query, (TASK,)).fetchone()
            return int(row[0]) if row else 0

    def drop(self, db: dict[str, Any]) -> None:
        if self.backend == "postgres":
            with self._admin() as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{db["NAME"]}" WITH (FORCE)')
        else:
            with contextlib.suppress(OSError):
                os.remove(db["NAME"])

    def version(self) -> str:
        if self.backend == "sqlite":
            return f"SQLite {sqlite3.sqlite_version}"
        with self._admin() as admin:
            row = admin.execute("SHOW server_version").fetchone()
            return f"PostgreSQL {row[0] if row else '?'}"

    def close(self) -> None:
        if self.backend == "postgres":
            with contextlib.suppress(Exception), self._admin() as admin:
                for name in self.created:
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Ctx:
    """Servers, options and results of one run."""

    args: argparse.Namespace
    store: RedisServer
    broker: RedisServer
    dbs: DcbDatabases
    log: Callable[[str], None]
    results: dict[str, dict[str, Result]] = field(default_factory=dict)

    def env(self, kind: str, db: dict[str, Any] | None = None) -> Env:
        a = self.args
        return Env(kind=kind, store_url=self.store.url(), store_port=self.store.port,
                   broker_url=self.broker.url(), dcb_db=db, idle_ticks=a.idle_ticks,
                   idle_budget_s=a.idle_budget_s, idle_sleep_s=a.idle_sleep_ms / 1000)

    @contextlib.contextmanager
    def fresh(self, kind: str, step: str) -> Iterator[Env]:
        """Empty store and broker (and a fresh dcb database) for one step."""
        for server in (self.store, self.broker):
            server.client().flushall()
        db = self.dbs.fresh(lambda d: self.env(kind, d), step) if kind == "dcb" else None
        try:
            yield self.env(kind, db)
        finally:
            if db is not None:
                self.dbs.drop(db)

    def stored(self, env: Env) -> int:
        if env.kind == "dcb":
            assert env.dcb_db is not None
            return self.dbs.count(env.dcb_db)
        key = ZSCHED_PREFIX + "schedule" if env.kind == "zsched" else REDBEAT_SCHEDULE_KEY
        return int(self.store.client().zcard(key))

    def put(self, kind: str, key: str, result: Result) -> None:
        self.results.setdefault(kind, {})[key] = result


def timed_out(x: int, n: int) -> str:
    return f"timed out with {x:,} of {n:,}"


# -------------------------------------------------------------------- steps
def load(ctx: Ctx, env: Env, plan: Plan) -> Result:
    """Load ``plan`` in a spawned child; on timeout, count what got stored."""
    try:
        res: Result = run_child(ctx.args.timeout_s, LOADERS[env.kind], env, plan)
    except Timeout:
        return {"timed_out": timed_out(ctx.stored(env), plan.n)}
    stored = ctx.stored(env)
    res.update(rate=plan.n / res["seconds"], stored=stored)
    if stored != plan.n:
        res["timed_out"] = f"stored {stored:,} of {plan.n:,}"
    return res


def step_load_idle(ctx: Ctx, kind: str, n: int) -> None:
    """Load ``n`` entries none of which is due soon, then time idle ticks of one beat."""
    steps = ctx.args.steps
    with ctx.fresh(kind, "idle") as env:
        plan = Plan(n, time.time() + 3600, WEEK_S - 7200, "idle")
        ctx.log(f"{kind} N={n:,}: load")
        loaded = load(ctx, env, plan)
        if "load" in steps:
            ctx.put(kind, f"load@{n}", loaded)
        if "idle" not in steps or "timed_out" in loaded:
            return
        ctx.log(f"{kind} N={n:,}: idle ticks")
        try:
            idle = run_child(ctx.args.timeout_s, idle_beat, env)
            idle["published"] = int(ctx.broker.client().llen(QUEUE))
        except Timeout:
            idle = {"timed_out": f"timed out (limit {ctx.args.timeout_s:.0f} s)"}
        ctx.put(kind, f"idle@{n}", idle)


def run_beats(ctx: Ctx, env: Env, beats: int, make_plan: Callable[[], Plan],
              deadline_after: Callable[[Plan, float], float]) -> tuple[Plan, Result, Watch]:
    """Start ``beats`` beat processes, load the plan, release them, watch the broker."""
    mpc = mp.get_context("spawn")
    go = mpc.Event()
    procs: list[Any] = []
    conns: list[Connection] = []
    try:
        for _ in range(beats):
            parent, child = mpc.Pipe()
            proc = mpc.Process(target=serve_beat, args=(env, go, child), daemon=True)
            proc.start()
            _LIVE.append(proc)
            child.close()
            procs.append(proc)
            conns.append(parent)
        for conn in conns:
            _receive(conn, "beat start-up", READY_TIMEOUT_S)
        plan = make_plan()
        loaded = load(ctx, env, plan)
        if "timed_out" in loaded:
            return plan, loaded, Watch(samples=[(time.time(), 0)], timed_out=True)
        go_at = time.time()
        go.set()
        watch = watch_broker(ctx.broker.client(), plan.n, deadline_after(plan, go_at),
                             ctx.args.settle_s, ctx.args.poll_ms / 1000, procs)
        loaded["go_at"] = go_at
        return plan, loaded, watch
    finally:
        go.set()
        for proc in procs:
            reap(proc)


def step_storm(ctx: Ctx, kind: str, n: int, beats: int) -> None:
    """``n`` entries overdue when ``beats`` beats start: time until all are published."""
    key = f"storm@{n}" if beats == 1 else f"multi{beats}@{n}"
    with ctx.fresh(kind, key.replace("@", "_")) as env:
        ctx.log(f"{kind} N={n:,}: storm with {beats} beat(s)")
        plan, loaded, watch = run_beats(
            ctx, env, beats, lambda: Plan(n, time.time() - 60, 0.0, "storm"),
            lambda plan, go_at: go_at + ctx.args.timeout_s)
        if "go_at" not in loaded:
            ctx.put(kind, key, {"timed_out": "load " + loaded["timed_out"]})
            return
        res = tally(plan, read_broker(ctx.broker.client(), watch))
        go_at = loaded["go_at"]
        res.pop("firsts")
        res.update(beats=beats, load_s=loaded["seconds"])
        if res["distinct"] == n:
            res["seconds"] = res["last_at"] - go_at
            res["rate"] = n / res["seconds"]
        else:
            res["timed_out"] = timed_out(res["distinct"], n)
        if res["first_at"] is not None:
            res["first_s"] = res["first_at"] - go_at
        ctx.put(kind, key, res)


def step_late(ctx: Ctx, kind: str, key: str, jobs: int, spread_s: float) -> None:
    """``jobs`` entries due over ``spread_s`` seconds, one running beat: lateness."""
    lead = ctx.args.lead_s
    with ctx.fresh(kind, key) as env:
        ctx.log(f"{kind}: {jobs:,} jobs due over {spread_s:g} s")
        plan, loaded, watch = run_beats(
            ctx, env, 1, lambda: Plan(jobs, time.time() + lead, spread_s, key),
            lambda plan, go_at: plan.due(plan.n - 1) + ctx.args.timeout_s)
        if "go_at" not in loaded:
            ctx.put(kind, key, {"timed_out": "load " + loaded["timed_out"]})
            return
        res = tally(plan, read_broker(ctx.broker.client(), watch))
        firsts = res.pop("firsts")
        late = sorted(firsts[plan.name(i)] - plan.due(i) for i in range(plan.n)
                      if plan.name(i) in firsts)
        res["lead_left_s"] = plan.first_due - loaded["go_at"]  # beat start-up headroom
        if late:
            res.update(p50_s=statistics.median(late), max_s=late[-1],
                       p99_s=late[min(len(late) - 1, int(len(late) * 0.99))],
                       last_s=res["last_at"] - plan.first_due)
        if res["distinct"] != plan.n:
            res["timed_out"] = timed_out(res["distinct"], plan.n)
        ctx.put(kind, key, res)


# -------------------------------------------------------------------- table
@dataclass(frozen=True)
class Row:
    step: str
    metric: str
    key: str  # result field
    fmt: str  # format spec of a number
    timed: bool = True  # the step's "timed out with X of N" replaces the number
    ratio: bool = True


ROWS: dict[str, list[Row]] = {
    "load": [Row("1 load", "seconds", "seconds", ".2f"),
             Row("1 load", "entries/s", "rate", ",.0f")],
    "idle": [Row("2 idle tick", "p50 ms", "p50_ms", ".3f"),
             Row("2 idle tick", "p99 ms", "p99_ms", ".3f"),
             Row("2 idle tick", "Redis commands/tick (store, incl. Lua)", "cmds_per_tick", ".2f"),
             Row("2 idle tick", "Redis round trips/tick", "round_trips_per_tick", ".2f"),
             Row("2 idle tick", "SQL queries/tick", "sql_per_tick", ".2f"),
             Row("2 idle tick", "start-up s (scheduler built + first tick)", "startup_s", ".2f"),
             Row("2 idle tick", "published while idle", "published", "d", ratio=False),
             Row("3 beat RSS", "MiB after load + idle", "rss_mib", ".1f")],
    "storm": [Row("4 storm, 1 beat", "s until all N published", "seconds", ".2f"),
              Row("4 storm, 1 beat", "messages/s", "rate", ",.0f"),
              Row("4 storm, 1 beat", "first publish after start s", "first_s", ".2f"),
              Row("4 storm, 1 beat", "duplicates / missing", "dup_miss", "", timed=False,
                  ratio=False)],
    "multi": [Row("5 {b} beats", "s until all N published", "seconds", ".2f"),
              Row("5 {b} beats", "messages/s", "rate", ",.0f"),
              Row("5 {b} beats", "duplicates / missing", "dup_miss", "", timed=False,
                  ratio=False)],
    "late": [Row("6 lateness ({j} jobs over {s} s)", "p50 s", "p50_s", ".3f", timed=False),
             Row("6 lateness ({j} jobs over {s} s)", "p99 s", "p99_s", ".3f", timed=False),
             Row("6 lateness ({j} jobs over {s} s)", "max s", "max_s", ".3f", timed=False),
             Row("6 lateness ({j} jobs over {s} s)", "duplicates / missing", "dup_miss", "",
                 timed=False, ratio=False)],
    "second": [Row("7 {j} due in one second", "s from the second's start to last publish",
                   "last_s", ".2f"),
               Row("7 {j} due in one second", "duplicates / missing", "dup_miss", "",
                   timed=False, ratio=False)],
}


def cell(res: Result | None, row: Row) -> tuple[str, float | None]:
    """The shown text and the number (for ratios) of one result field."""
    if res is None:
        return "-", None
    if row.timed and "timed_out" in res:
        return res["timed_out"], None
    if row.key == "dup_miss":
        if "duplicates" not in res:
            return res.get("timed_out", "-"), None
        return f"{res['duplicates']:,} / {res['missing']:,}", None
    value = res.get(row.key)
    if value is None:
        return "-", None
    return format(value, row.fmt), float(value)


def render(ctx: Ctx, kinds: list[str]) -> str:
    a = ctx.args
    ratio_kinds = [k for k in kinds if k != "redbeat"] if "redbeat" in kinds else []
    head = ["step", "N", "metric", *kinds, *(f"{k}/redbeat" for k in ratio_kinds)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, rows in _row_keys(ctx, kinds):
        for row in rows:
            cells = {k: cell(ctx.results.get(k, {}).get(key), row) for k in kinds}
            if all(text == "-" for text, _ in cells.values()):
                continue
            jobs = a.second_jobs if key.startswith("second") else a.late_jobs
            step = row.step.format(b=key[5:key.index("@")] if key.startswith("multi") else "",
                                   j=f"{jobs:,}", s=f"{a.late_spread_s:g}")
            n = key.split("@")[1] if "@" in key else "-"
            out = [step, f"{int(n):,}" if n.isdigit() else n, row.metric,
                   *(cells[k][0] for k in kinds)]
            base = cells["redbeat"][1] if "redbeat" in cells else None
            for k in ratio_kinds:
                mine = cells[k][1]
                out.append(f"{mine / base:.3g}x" if row.ratio and mine is not None and base
                           else "-")
            lines.append("| " + " | ".join(out) + " |")
    return "\n".join(lines)


def _row_keys(ctx: Ctx, kinds: list[str]) -> Iterator[tuple[str, list[Row]]]:
    a = ctx.args
    for n in a.sizes:
        yield f"load@{n}", ROWS["load"]
    for n in a.sizes:
        yield f"idle@{n}", ROWS["idle"]
    for n in a.sizes:
        yield f"storm@{n}", ROWS["storm"]
    for b in a.beats:
        for n in a.multi_sizes:
            yield f"multi{b}@{n}", ROWS["multi"]
    yield "late", ROWS["late"]
    yield "second", ROWS["second"]


def versions(dbs: DcbDatabases, kinds: list[str]) -> dict[str, str]:
    out: dict[str, str] = {"python": platform.python_version()}
    for dist in ("celery-zsched", "celery-redbeat", "django-celery-beat", "celery", "kombu",
                 "redis", "Django", "psycopg"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    exe = shutil.which("redis-server") or "redis-server"
    out["redis-server"] = subprocess.run([exe, "--version"], capture_output=True, text=True,
                                         check=False).stdout.split()[2].removeprefix("v=")
    if "dcb" in kinds:
        out["dcb database"] = dbs.version()
    return out


def machine() -> str:
    model = platform.processor() or "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (f"{psutil.cpu_count()} cores ({model}), "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM, "
            f"load average {os.getloadavg()[0]:.2f} at the end")


# --------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])

    def ints(text: str) -> list[int]:
        return [int(s.replace("_", "")) for s in text.split(",") if s.strip()]

    def names(text: str) -> list[str]:
        return [s.strip() for s in text.split(",") if s.strip()]

    p.add_argument("--sizes", type=ints, default=[10_000, 100_000],
                   help="N for load, idle and storm (default 10000,100000)")
    p.add_argument("--multi-sizes", type=ints, default=None,
                   help="N for the multi-beat step (default: --sizes)")
    p.add_argument("--beats", type=ints, default=[2, 4], help="beats in the multi step (2,4)")
    p.add_argument("--only", type=names, default=list(KINDS), help="zsched,redbeat,dcb")
    p.add_argument("--steps", type=names, default=list(STEPS), help=",".join(STEPS))
    p.add_argument("--timeout-s", type=float, default=120.0,
                   help="time limit of each step (from beat start, or from the last due time)")
    p.add_argument("--settle-s", type=float, default=2.0,
                   help="a publishing step ends once N are in and the queue was still this long")
    p.add_argument("--poll-ms", type=float, default=5.0, help="broker LLEN poll period")
    p.add_argument("--idle-ticks", type=int, default=200)
    p.add_argument("--idle-budget-s", type=float, default=20.0,
                   help="stop timing idle ticks after this long (at least 5 ticks)")
    p.add_argument("--idle-sleep-ms", type=float, default=1.0)
    p.add_argument("--late-jobs", type=int, default=600)
    p.add_argument("--late-spread-s", type=float, default=30.0)
    p.add_argument("--second-jobs", type=int, default=10_000)
    p.add_argument("--lead-s", type=float, default=15.0,
                   help="steps 6 and 7: the first job is due this long after loading starts")
    p.add_argument("--dcb-db", choices=("postgres", "sqlite"), default="postgres")
    p.add_argument("--pg-dsn", default="host=127.0.0.1 port=5432 user=postgres dbname=postgres")
    p.add_argument("--dcb-conn-max-age", type=float, default=0.0,
                   help="Django CONN_MAX_AGE for dcb (default 0, Django's default: "
                        "DatabaseScheduler reconnects every tick)")
    p.add_argument("--json", help="also write raw results to this file")
    args = p.parse_args(argv)
    args.multi_sizes = args.multi_sizes or args.sizes
    bad = (set(args.only) - set(KINDS)) | (set(args.steps) - set(STEPS))
    if bad:
        p.error(f"unknown scheduler or step {sorted(bad)}")
    return args


def run_all(ctx: Ctx, kinds: list[str]) -> None:
    a, steps = ctx.args, ctx.args.steps
    todo: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
    if {"load", "idle"} & set(steps):
        todo += [(step_load_idle, (n,)) for n in a.sizes]
    if "storm" in steps:
        todo += [(step_storm, (n, 1)) for n in a.sizes]
    if "multi" in steps:
        todo += [(step_storm, (n, b)) for b in a.beats for n in a.multi_sizes]
    if "late" in steps:
        todo.append((step_late, ("late", a.late_jobs, a.late_spread_s)))
    if "second" in steps:
        todo.append((step_late, ("second", a.second_jobs, 1.0)))
    for fn, fn_args in todo:  # step by step, the schedulers in turn: same minute, same noise
        for kind in kinds:
            fn(ctx, kind, *fn_args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kinds = [k for k in KINDS if k in args.only]
    started = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {msg}", file=sys.stderr, flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    dbs = DcbDatabases(args.dcb_db, args.pg_dsn)
    dbs.conn_max_age = int(args.dcb_conn_max_age)
    servers: list[RedisServer] = []
    try:
        servers.append(RedisServer("store").start())
        servers.append(RedisServer("broker").start())
        ctx = Ctx(args, servers[0], servers[1], dbs, log)
        log(f"store redis :{ctx.store.port}, broker redis :{ctx.broker.port}")
        run_all(ctx, kinds)
        info = {"versions": versions(dbs, kinds), "machine": machine()}
    finally:
        for proc in list(_LIVE):
            reap(proc, 2.0)
        for server in servers:
            server.stop()
        dbs.close()
    print(header(info, args))
    print(render(ctx, kinds))
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({**info, "args": {k: v for k, v in vars(args).items()},
                       "results": ctx.results}, fh, indent=2, default=str)
    return 0


def header(info: dict[str, Any], args: argparse.Namespace) -> str:
    vers = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    return (f"Versions: {vers}.\nMachine: {info['machine']}.\n"
            f"dcb database: {args.dcb_db}; step time limit {args.timeout_s:g} s.\n")


if __name__ == "__main__":
    sys.exit(main())
