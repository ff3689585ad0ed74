#!/usr/bin/env python
"""Ten million jobs on a local three-master Redis Cluster.

Usage::

    /work/venv/bin/python benchmarks/scale.py                    # N = 10,000,000 (long)
    /work/venv/bin/python benchmarks/scale.py --jobs 100000      # a quick run

The script starts a throwaway Redis Cluster of three masters (no replicas,
``--cluster-enabled yes --save "" --appendonly no``, joined with
``redis-cli --cluster create``) and a throwaway broker ``redis-server``, all on
free ports, and stops them at the end, also on error, SIGTERM or Ctrl-C.
127.0.0.1:6379 is never used. The store has ``--partitions`` partitions
(``zsched_partitions``) spread over the three masters (``zsched_redis_cluster``).

Steps, each in fresh spawned processes and each under a time limit (a step
past its limit reports "timed out with X of N"):

1. import ``--small`` (100,000) staggered interval jobs, streamed through
   ``Job.from_dict`` into one ``Store.upsert_many``; Redis memory per job;
   idle tick and beat RSS in a fresh beat;
2. import the rest up to ``--jobs`` (the rows come from a generator, so they
   are never all in memory); memory per job; idle tick and beat RSS again;
3. storm: ``--storm`` of the stored jobs are made due at once (ZADD of a due
   score, straight into each partition's schedule), then 1, 2 and 4 beat
   processes drain that same set (it is made due again before each run). The
   broker queue is read back: every job of the set published exactly once.

It prints one markdown table. A script, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing as mp
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

import psutil  # type: ignore[import-untyped]
import redis
from redis.cluster import RedisCluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import (
    MiB,
    RedisServer,
    RoundTrips,
    _receive,
    _redis_cpu_s,
    celery_app,
    command_calls,
    command_delta,
    count_claims,
    rss_mib,
    run_child,
)

T = TypeVar("T")
QUEUE = "celery"  # Celery's default queue: where every benchmark job goes
WARMUP_QUEUE = "scale.warmup"  # warm-up messages go here, never into QUEUE
STORE_PREFIX = "{scale}:"
MASTERS = 3
#: Claims and publishes per storm: one beat's batch.
DEFAULT_BATCH = 1000


# --------------------------------------------------------------------- config
@dataclass(frozen=True)
class Cfg:
    """What every child process needs to reach the cluster and the broker."""

    store_url: str  # any node of the cluster
    ports: tuple[int, ...]  # the masters
    broker_url: str
    partitions: int
    batch_size: int
    interval_s: float
    idle_ticks: int
    idle_sleep_s: float


def settings_for(cfg: Cfg) -> Any:
    from celery_zsched.config import Settings

    return Settings(redis_url=cfg.store_url, redis_cluster=True, key_prefix=STORE_PREFIX,
                    partitions=cfg.partitions, batch_size=cfg.batch_size,
                    max_queued=100_000_000)


def make_app(cfg: Cfg) -> Any:
    """A Celery app on the throwaway broker, with zsched on the cluster."""
    return celery_app("zsched_scale", cfg.broker_url, cfg.store_url, STORE_PREFIX,
                      cfg.batch_size, zsched_redis_cluster=True,
                      zsched_partitions=cfg.partitions)


def peak_rss_mib() -> float:
    """Peak RSS of this process (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def job_id(i: int) -> str:
    return f"j{i}"


def make_rows(start: int, count: int, interval_s: float) -> Iterator[dict[str, Any]]:
    """Import rows as an import file would give them: URL jobs with an interval and meta."""
    for i in range(start, start + count):
        yield {"id": job_id(i), "url": f"https://shop{i % 97}.example.com/item/{i}",
               "meta": {"i": i, "src": "scale"}, "interval_s": interval_s}


# ------------------------------------------------------------ redis servers
def start_cluster(servers: list[RedisServer],
                  log: Callable[[str], None]) -> list[RedisServer]:
    """Three masters joined by ``redis-cli --cluster create``; appended to ``servers``."""
    nodes = []
    for i in range(MASTERS):
        node = RedisServer(f"master{i}", ("--cluster-enabled", "yes",
                                          "--cluster-config-file", "nodes.conf",
                                          "--cluster-node-timeout", "5000"), stop_wait_s=10)
        servers.append(node)
        nodes.append(node.start())
    cli = shutil.which("redis-cli")
    if cli is None:
        raise SystemExit("redis-cli not found on PATH")
    subprocess.run([cli, "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes],
                    "--cluster-replicas", "0", "--cluster-yes"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        infos = [n.client().cluster("info") for n in nodes]
        if all(str(i.get("cluster_state")) == "ok" and int(i.get("cluster_known_nodes", 0))
               == MASTERS for i in infos):
            log("cluster: " + ", ".join(f":{n.port}" for n in nodes) + " (3 masters, ok)")
            return nodes
        time.sleep(0.2)
    raise RuntimeError("the cluster did not reach cluster_state:ok")


def on_each(ports: tuple[int, ...], fn: Callable[[redis.Redis], T]) -> list[T]:
    """``fn(client)`` with a client of each of ``ports``, in order."""
    out = []
    for port in ports:
        client = redis.Redis(port=port, decode_responses=True)
        try:
            out.append(fn(client))
        finally:
            client.close()
    return out


def used_memory(ports: tuple[int, ...]) -> list[int]:
    return on_each(ports, lambda client: int(client.info("memory")["used_memory"]))


def redis_cpu_s(ports: tuple[int, ...]) -> float:
    """CPU seconds ``ports`` have used so far (INFO cpu, user + system)."""
    return sum(on_each(ports, _redis_cpu_s))


def commands_on(ports: tuple[int, ...]) -> Counter[str]:
    """Calls per command name, summed over ``ports`` (INFO commandstats, incl. inside Lua)."""
    return sum(on_each(ports, command_calls), Counter())


def rtt_ms(port: int, n: int = 2000) -> dict[str, float]:
    """p50 / p99 of a PING round trip to ``port`` from this process."""
    client = redis.Redis(port=port)
    client.ping()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.ping()
        times.append((time.perf_counter() - t0) * 1000)
    client.close()
    times.sort()
    return {"p50": statistics.median(times), "p99": times[int(n * 0.99)]}


def run_limited(fn: Callable[..., Any], *args: Any, timeout: float) -> Any:
    """``fn(*args)`` in a fresh spawned process; ``None`` if it runs past ``timeout``."""
    try:
        return run_child(fn, *args, timeout=timeout)
    except TimeoutError:
        return None


# ------------------------------------------------------------------- import
def import_jobs(cfg: Cfg, start: int, count: int, progress: Any) -> dict[str, Any]:
    """Stream ``count`` rows through ``Job.from_dict`` into one staggered ``upsert_many``.

    The rows come from a generator and each is validated as ``upsert_many``
    pulls it, so neither the rows nor the jobs are ever all in memory. Making
    a row stands for reading the file and is timed with the rest.
    """
    from celery_zsched.core.job import Defaults, Job
    from celery_zsched.store import Store

    settings = settings_for(cfg)
    store = Store.from_settings(settings)
    defaults = Defaults.from_settings(settings)
    store.now_ms()  # connect outside the timing
    clock = time.perf_counter
    from_dict = Job.from_dict
    validate = [0.0]

    def jobs() -> Iterator[Any]:
        for i, row in enumerate(make_rows(start, count, cfg.interval_s)):
            t0 = clock()
            job = from_dict(row, defaults, row=i)
            validate[0] += clock() - t0
            yield job

    def report_progress(done: int) -> None:
        progress.value = done

    redis_cpu = redis_cpu_s(cfg.ports)
    gc.disable()  # as the importer does; nothing here makes cycles
    started, cpu = clock(), time.process_time()
    try:
        report = store.upsert_many(jobs(), stagger=True, total=count, progress=report_progress)
    finally:
        gc.enable()
    seconds = clock() - started
    cpu_s = time.process_time() - cpu
    redis_cpu = redis_cpu_s(cfg.ports) - redis_cpu
    store.client.close()
    return {"n": count, "seconds": seconds, "validate_s": validate[0], "cpu_s": cpu_s,
            "redis_cpu_s": redis_cpu, "created": report.created, "rows_per_s": count / seconds,
            "peak_rss_mib": peak_rss_mib()}


def stored_counts(cfg: Cfg) -> dict[str, Any]:
    """Jobs (defs) and scheduled entries over all partitions, and keys per master."""
    from celery_zsched.store.keys import Keys

    client = RedisCluster.from_url(cfg.store_url, decode_responses=True)
    pipe = client.pipeline(transaction=False)  # type: ignore[no-untyped-call]
    for keys in Keys.for_prefix(STORE_PREFIX).partitions(cfg.partitions):
        pipe.hlen(keys.defs)
        pipe.zcard(keys.schedule)
        pipe.zcard(keys.queued)
    replies = pipe.execute()
    client.close()
    per_master = on_each(cfg.ports, lambda node: int(node.dbsize()))
    return {"defs": sum(replies[0::3]), "scheduled": sum(replies[1::3]),
            "queued": sum(replies[2::3]), "keys_per_master": per_master}


# ---------------------------------------------------------------------- beat
class BeatHarness:
    """A real ``ZSchedScheduler`` in this process, driven tick by tick."""

    def __init__(self, cfg: Cfg) -> None:
        from celery_zsched.beat.scheduler import ZSchedScheduler

        self.cfg = cfg
        self.app = make_app(cfg)
        self.sched = ZSchedScheduler(self.app)
        self.claimed = 0
        count_claims(self)

    def warmup(self) -> dict[str, Any]:
        """A few ticks and a warm producer (warm-up messages go to another queue)."""
        for _ in range(20):
            self.sched.tick()
        producer: Any = self.sched.producer
        with producer.batch(max_size=10):
            for i in range(10):
                self.app.send_task("scrape", kwargs={"url": "https://w.example.com", "i": i},
                                   producer=producer, queue=WARMUP_QUEUE)
        return {"rss_mib": rss_mib()}

    def drain(self, limit_s: float = 600.0) -> dict[str, Any]:
        """Tick until a tick reports it is waiting (no full batch), or ``limit_s`` passes."""
        self.claimed = 0
        ticks = 0
        cpu = time.process_time()
        started = time.monotonic()
        timed_out = False
        while True:
            ticks += 1
            if self.sched.tick() > 0:
                break
            if time.monotonic() - started > limit_s:
                timed_out = True
                break
        ended = time.monotonic()
        return {"claimed": self.claimed, "ticks": ticks, "started": started, "ended": ended,
                "seconds": ended - started, "cpu_s": time.process_time() - cpu,
                "rss_mib": rss_mib(), "timed_out": timed_out}

    def idle(self) -> dict[str, Any]:
        """Time ``idle_ticks`` ticks with nothing due; count commands and round trips."""
        pre = self.drain()
        self.claimed = 0
        times: list[float] = []
        clock = time.perf_counter
        cpu = 0.0
        ports = self.cfg.ports
        before = commands_on(ports)
        redis_cpu = redis_cpu_s(ports)
        with RoundTrips(*ports) as trips:
            for _ in range(self.cfg.idle_ticks):
                time.sleep(self.cfg.idle_sleep_s)  # a beat sleeps between ticks
                c0 = time.process_time()
                t0 = clock()
                self.sched.tick()
                times.append(clock() - t0)
                cpu += time.process_time() - c0
        redis_cpu = redis_cpu_s(ports) - redis_cpu
        calls = command_delta(before, commands_on(ports))
        times_ms = sorted(t * 1000 for t in times)
        ticks = len(times_ms)
        return {
            "pre_drained": pre["claimed"], "claimed_during": self.claimed, "ticks": ticks,
            "p50_ms": statistics.median(times_ms),
            "p99_ms": times_ms[min(ticks - 1, int(ticks * 0.99))],
            "cmds_per_tick": sum(calls.values()) / ticks,
            "round_trips_per_tick": trips.count / ticks,
            "cpu_us": cpu / ticks * 1e6, "redis_cpu_us": redis_cpu / ticks * 1e6,
            "cmd_breakdown": {k: round(v / ticks, 2) for k, v in calls.most_common(8)},
        }


def beat_idle(cfg: Cfg) -> dict[str, Any]:
    """A fresh beat: warm up, drain what is due, time the idle ticks; RSS along the way."""
    beat = BeatHarness(cfg)
    warm = beat.warmup()
    idle = beat.idle()
    idle["rss_warm_mib"] = warm["rss_mib"]
    idle["rss_mib"] = rss_mib()
    idle["rtt"] = rtt_ms(cfg.ports[0])
    beat.sched.close()
    return idle


def _drainer(cfg: Cfg, go: Any, limit_s: float, conn: Connection) -> None:
    """One of several beats over the same storm: warm up, wait for ``go``, drain."""
    try:
        beat = BeatHarness(cfg)
        warm = beat.warmup()
        beat.drain()  # whatever fell due by itself meanwhile
        conn.send(("ok", warm))
        go.wait()
        out = beat.drain(limit_s)
        out["rss_warm_mib"] = warm["rss_mib"]
        conn.send(("ok", out))
        beat.sched.close()
    except BaseException:
        conn.send(("err", traceback.format_exc()))


# -------------------------------------------------------------------- storm
def storm_ids(n: int, m: int) -> list[str]:
    """``m`` of the ``n`` stored ids, evenly spread over them."""
    step = max(1, n // m)
    return [job_id(i) for i in range(0, step * m, step)][:m]


def make_due(cfg: Cfg, ids: list[str]) -> int:
    """Put ``ids`` back in their partitions' schedules, due now (a direct ZADD).

    A job that a previous storm left queued leaves the queued set first, so the
    same set can storm again (its next claim publishes the same occurrence).
    """
    from celery_zsched.store.keys import Keys, partition_of

    parts = Keys.for_prefix(STORE_PREFIX).partitions(cfg.partitions)
    client = RedisCluster.from_url(cfg.store_url, decode_responses=True)
    sec, usec = client.time()
    due = int(sec) * 1000 + int(usec) // 1000 - 1000
    by_part: dict[int, list[str]] = {}
    for job in ids:
        by_part.setdefault(partition_of(job, cfg.partitions), []).append(job)
    added = 0
    for part, members in by_part.items():
        keys = parts[part]
        for start in range(0, len(members), 5000):
            chunk = members[start:start + 5000]
            pipe = client.pipeline(transaction=False)  # type: ignore[no-untyped-call]
            pipe.zrem(keys.queued, *chunk)
            pipe.zadd(keys.schedule, dict.fromkeys(chunk, due))
            pipe.execute()
            added += len(chunk)
    client.close()
    return added


def broker_check(broker_url: str, ids: list[str]) -> dict[str, Any]:
    """Read the whole queue: each storm job exactly once? Other messages are counted apart."""
    from celery_zsched.store import task_id_for

    wanted = set(ids)
    client = redis.Redis.from_url(broker_url, decode_responses=True)
    length = int(client.llen(QUEUE))
    seen: Counter[str] = Counter()
    task_ids: set[str] = set()
    bad = 0
    step = 10_000
    for start in range(0, length, step):
        for raw in client.lrange(QUEUE, start, start + step - 1):
            headers = json.loads(raw)["headers"]
            seen[headers.get("zsched_job_id", "")] += 1
            task_ids.add(headers["id"])
            expected = task_id_for(headers["zsched_job_id"], int(headers["zsched_occurrence"]),
                                   int(headers["zsched_attempt"]))
            bad += headers["id"] != expected or headers.get("task") != "scrape"
    client.close()
    in_set = sum(1 for j in seen if j in wanted)
    dup = sum(c - 1 for c in seen.values() if c > 1)
    return {"llen": length, "storm_published": sum(c for j, c in seen.items() if j in wanted),
            "missing": len(wanted) - in_set, "duplicates": dup,
            "others": sum(c for j, c in seen.items() if j not in wanted),
            "unique_task_ids": len(task_ids), "bad": bad,
            "ok": in_set == len(wanted) and dup == 0 and len(task_ids) == length and not bad}


def storm(cfg: Cfg, beats: int, ids: list[str], broker: RedisServer, limit_s: float,
          log: Callable[[str], None]) -> dict[str, Any]:
    """``beats`` fresh beat processes drain the same due set; broker checked after."""
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    procs, conns = [], []
    try:
        for _ in range(beats):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_drainer, args=(cfg, go, limit_s, child), daemon=True)
            proc.start()
            child.close()
            procs.append(proc)
            conns.append(parent)
        for conn in conns:
            _receive(conn, "drainer warm-up", 300)
        broker.client().flushall()
        made = make_due(cfg, ids)
        log(f"storm x{beats}: {made:,} jobs due, released")
        cpu = redis_cpu_s(cfg.ports)
        broker_cpu = redis_cpu_s((broker.port,))
        started = time.monotonic()
        go.set()
        parts = []
        for conn in conns:
            try:
                parts.append(_receive(conn, "drainer", limit_s + 120))
            except TimeoutError:
                parts.append({"claimed": 0, "ended": time.monotonic(), "timed_out": True,
                              "cpu_s": 0.0, "rss_mib": 0.0, "rss_warm_mib": 0.0})
        redis_cpu = redis_cpu_s(cfg.ports) - cpu
        broker_cpu = redis_cpu_s((broker.port,)) - broker_cpu
    finally:
        go.set()
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
    seconds = max(p["ended"] for p in parts) - started
    claimed = [int(p["claimed"]) for p in parts]
    check = broker_check(cfg.broker_url, ids)
    return {"beats": beats, "seconds": seconds, "claimed": claimed,
            "rate": check["storm_published"] / seconds,
            "timed_out": any(p["timed_out"] for p in parts),
            "beat_cpu_s": sum(p["cpu_s"] for p in parts), "redis_cpu_s": redis_cpu,
            "broker_cpu_s": broker_cpu, "rss_mib": [p["rss_mib"] for p in parts],
            "rss_warm_mib": [p["rss_warm_mib"] for p in parts], "check": check}


# -------------------------------------------------------------------- steps
@dataclass
class SizeResult:
    n: int
    imported: dict[str, Any] | None = None  # the import step that reached n
    import_timeout: str = ""
    total_import_s: float = 0.0
    memory: list[int] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)
    idle: dict[str, Any] | None = None
    idle_timeout: str = ""


def run_import(cfg: Cfg, start: int, count: int, limit_s: float) -> tuple[dict[str, Any] | None,
                                                                        int]:
    """The import step under ``limit_s``: its result (None past the limit) and rows stored."""
    ctx = mp.get_context("spawn")
    progress = ctx.Value("q", 0)
    res = run_limited(import_jobs, cfg, start, count, progress, timeout=limit_s)
    return res, int(progress.value) if res is None else count


# --------------------------------------------------------------------- table
def render(sizes: list[SizeResult], storms: list[dict[str, Any]], baseline: list[int],
           m: int, args: argparse.Namespace) -> str:
    cols = [f"N={s.n:,}" for s in sizes]
    lines = ["| metric | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]

    def row(name: str, fmt: Callable[[SizeResult], str]) -> None:
        cells = []
        for s in sizes:
            try:
                cells.append(fmt(s))
            except (KeyError, TypeError, ZeroDivisionError, IndexError):
                cells.append("-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    def step(part: str, timeout: str) -> Callable[[str, str], Callable[[SizeResult], str]]:
        """Cells of ``key`` in the step ``part``, formatted ``f``; its time-out note instead."""
        def of(key: str, f: str) -> Callable[[SizeResult], str]:
            def cell(s: SizeResult) -> str:
                note: str = getattr(s, timeout)
                return note or format(getattr(s, part)[key], f)
            return cell
        return of

    imp, idle = step("imported", "import_timeout"), step("idle", "idle_timeout")

    row("import step: rows (this step)", imp("n", ","))
    row("import step: s", imp("seconds", ".1f"))
    row("import step: rows/s (validate + store, streamed)", imp("rows_per_s", ",.0f"))
    row("import step: Job.from_dict share of the time", lambda s: (
        f"{s.imported['validate_s'] / s.imported['seconds']:.0%}" if s.imported else "-"))
    row("import step: CPU us/row, importer + 3 masters", lambda s: (
        f"{s.imported['cpu_s'] / s.imported['n'] * 1e6:.1f} + "
        f"{s.imported['redis_cpu_s'] / s.imported['n'] * 1e6:.1f}" if s.imported else "-"))
    row("import step: importer peak RSS MiB", imp("peak_rss_mib", ".0f"))
    row("import: total s to reach N (rows/s)", lambda s: (
        f"{s.total_import_s:.0f} ({s.n / s.total_import_s:,.0f})" if s.total_import_s else "-"))
    row("stored: defs / scheduled + queued", lambda s: (
        f"{s.counts['defs']:,} / {s.counts['scheduled'] + s.counts['queued']:,}"))
    row("keys per master (3 masters)", lambda s: "/".join(map(str, s.counts["keys_per_master"])))
    row("Redis used_memory, sum of masters, MiB", lambda s: f"{sum(s.memory) / MiB:,.0f}")
    row("Redis memory per job, bytes (minus empty cluster)",
        lambda s: f"{(sum(s.memory) - sum(baseline)) / s.n:,.0f}")
    row("per master used_memory MiB", lambda s: "/".join(f"{b / MiB:,.0f}" for b in s.memory))

    row(f"idle tick p50 ms ({args.idle_ticks} ticks, {args.idle_sleep_ms:g} ms apart)",
        idle("p50_ms", ".3f"))
    row("idle tick p99 ms", idle("p99_ms", ".3f"))
    row("idle tick: round trips/tick (client side, to the masters)",
        idle("round_trips_per_tick", ".2f"))
    row("idle tick: Redis commands/tick (all masters, incl. inside Lua)",
        idle("cmds_per_tick", ".1f"))
    row("idle tick: CPU us/tick, beat + 3 masters", lambda s: (
        f"{s.idle['cpu_us']:.0f} + {s.idle['redis_cpu_us']:.0f}" if s.idle else "-"))
    row("idle tick: jobs that fell due meanwhile", idle("claimed_during", ","))
    row("beat RSS MiB after warm-up / after idle ticks", lambda s: (
        f"{s.idle['rss_warm_mib']:.1f} / {s.idle['rss_mib']:.1f}" if s.idle else "-"))
    row("PING round trip to a master, p50 / p99 ms", lambda s: (
        f"{s.idle['rtt']['p50']:.3f} / {s.idle['rtt']['p99']:.3f}" if s.idle else "-"))
    def in_last(cell: str) -> Callable[[SizeResult], str]:
        return lambda s: cell if s is sizes[-1] else "-"

    for name, cell in storm_rows(storms, m):
        row(name, in_last(cell))
    return "\n".join(lines)


def storm_rows(storms: list[dict[str, Any]], m: int) -> list[tuple[str, str]]:
    """(metric, cell) rows of the storms; they go in the column of the largest N."""
    out: list[tuple[str, str]] = []
    one = next((r for r in storms if r["beats"] == 1 and not r["timed_out"]), None)
    for r in storms:
        c = r["check"]
        k = f"{r['beats']} beat" + ("s" if r["beats"] > 1 else "")
        if r["timed_out"]:
            rate = f"timed out with {c['storm_published']:,} of {m:,}"
        else:
            rate = f"{r['rate']:,.0f}"
            if one is not None and r is not one and one["rate"] > 0:
                rate += f" ({r['rate'] / one['rate']:.2f}x 1 beat)"
        verdict = "OK" if c["ok"] else "MISMATCH"
        out += [
            (f"storm of {m:,} due, {k}: jobs/s", rate),
            (f"storm {k}: s, split",
             f"{r['seconds']:.1f}, {'/'.join(f'{x:,}' for x in r['claimed'])}"),
            (f"storm {k}: published / missing / duplicates / other",
             f"{c['storm_published']:,} / {c['missing']:,} / {c['duplicates']:,} / "
             f"{c['others']:,} {verdict}"),
            (f"storm {k}: CPU us/job, beats + masters + broker",
             f"{r['beat_cpu_s'] / m * 1e6:.0f} + {r['redis_cpu_s'] / m * 1e6:.0f} + "
             f"{r['broker_cpu_s'] / m * 1e6:.0f}"),
            (f"storm {k}: beat RSS MiB after warm-up -> after",
             ", ".join(f"{a:.0f}->{b:.0f}"
                       for a, b in zip(r["rss_warm_mib"], r["rss_mib"], strict=True))),
        ]
    return out


# ---------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--jobs", type=lambda s: int(s.replace("_", "").replace(",", "")),
                   default=10_000_000, help="N, the jobs stored in the end (default 10,000,000)")
    p.add_argument("--small", type=int, default=100_000,
                   help="the size the idle tick and beat RSS are compared with (default 100,000)")
    p.add_argument("--partitions", type=int, default=12, help="zsched_partitions (default 12)")
    p.add_argument("--storm", type=int, default=300_000,
                   help="jobs made due at once for the storms (default 300,000; at most N/2)")
    p.add_argument("--beats", default="1,2,4", help="beat processes per storm (default 1,2,4)")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH)
    p.add_argument("--interval-s", type=float, default=365 * 86400.0,
                   help="interval of the stored jobs; long, so few fall due by themselves "
                        "while idle ticks are timed (default one year)")
    p.add_argument("--idle-ticks", type=int, default=1000)
    p.add_argument("--idle-sleep-ms", type=float, default=1.0)
    p.add_argument("--import-limit-s", type=float, default=2400.0,
                   help="time limit of each import step (default 2400)")
    p.add_argument("--idle-limit-s", type=float, default=600.0)
    p.add_argument("--storm-limit-s", type=float, default=600.0,
                   help="time limit of each storm drain (default 600)")
    p.add_argument("--json", help="also write raw results to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    n_total = args.jobs
    small = min(args.small, n_total)
    targets = [small] + ([n_total] if n_total > small else [])
    m = min(args.storm, max(1, n_total // 2))
    beats = [int(b) for b in args.beats.split(",") if b.strip()]
    t_start = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    servers: list[RedisServer] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sizes: list[SizeResult] = []
    storms: list[dict[str, Any]] = []
    baseline: list[int] = []
    try:
        nodes = start_cluster(servers, log)
        broker = RedisServer("broker").start()
        servers.append(broker)
        log(f"broker on :{broker.port}")
        ports = tuple(n.port for n in nodes)
        cfg = Cfg(store_url=nodes[0].url(), ports=ports, broker_url=broker.url(),
                  partitions=args.partitions, batch_size=args.batch_size,
                  interval_s=args.interval_s, idle_ticks=args.idle_ticks,
                  idle_sleep_s=args.idle_sleep_ms / 1000)
        baseline = used_memory(ports)
        stored = 0
        elapsed = 0.0
        for target in targets:
            res = SizeResult(target)
            sizes.append(res)
            log(f"import {target - stored:,} rows (to N={target:,})")
            imported, done = run_import(cfg, stored, target - stored, args.import_limit_s)
            if imported is None:
                res.import_timeout = f"timed out with {stored + done:,} of {target:,}"
                log(f"import {res.import_timeout}")
                res.n = stored + done
                res.memory = used_memory(ports)
                res.counts = stored_counts(cfg)
                break
            stored = target
            res.imported = imported
            elapsed += imported["seconds"]
            res.total_import_s = elapsed
            log(f"import: {imported['seconds']:.1f}s, {imported['rows_per_s']:,.0f} rows/s")
            res.memory = used_memory(ports)
            res.counts = stored_counts(cfg)
            log(f"memory {sum(res.memory) / MiB:,.0f} MiB; idle ticks in a fresh beat")
            res.idle = run_limited(beat_idle, cfg, timeout=args.idle_limit_s)
            if res.idle is None:
                res.idle_timeout = f"timed out ({args.idle_limit_s:.0f}s)"
            else:
                log(f"idle p50 {res.idle['p50_ms']:.3f} ms, "
                    f"{res.idle['round_trips_per_tick']:.2f} round trips/tick")
        if sizes and not sizes[-1].import_timeout:
            ids = storm_ids(sizes[-1].n, m)
            for k in beats:
                log(f"storm: {k} beat(s) over {m:,} due jobs")
                storms.append(storm(cfg, k, ids, broker, args.storm_limit_s, log))
                r = storms[-1]
                log(f"storm x{k}: {r['rate']:,.0f} jobs/s, ok={r['check']['ok']}")
    finally:
        for proc in psutil.Process().children(recursive=True):
            if proc.pid not in {s.proc.pid for s in servers if s.proc is not None}:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        for server in servers:
            server.stop()
    print(render(sizes, storms, baseline, m, args))
    print(f"\n(total {time.monotonic() - t_start:.0f}s; {args.partitions} partitions on "
          f"{MASTERS} masters; batch {args.batch_size}; python {sys.version.split()[0]}, "
          f"redis {redis_version()}, {psutil.cpu_count()} CPUs, "
          f"load avg {os.getloadavg()[0]:.2f}; empty cluster used_memory "
          f"{sum(baseline) / MiB:.1f} MiB)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"sizes": [vars(s) for s in sizes], "storms": storms,
                       "baseline": baseline, "args": vars(args)}, fh, indent=2, default=str)
    return 0


def redis_version() -> str:
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True,
                         check=False).stdout
    return next((w.split("=")[1] for w in out.split() if w.startswith("v=")), "?")


if __name__ == "__main__":
    sys.exit(main())
