#!/usr/bin/env python
"""Benchmark per-domain pacing (issue 11): politeness and throughput, claim cost, idle claim.

Usage::

    /work/venv/bin/python benchmarks/pacing.py [--quick] [--parts fleet,drain,cost,idle]
        [--json out.json]

Four parts, each printed as a markdown table:

1. **fleet**: N jobs (default 100,000) over D loopback domains (default 1,000;
   hosts 127.1.x.y, every one of which reaches this machine), each domain paced
   at ``--delay-s`` (default 1 s) with a cap of 1 in flight. A real ``celery beat
   -S celery_zsched`` and real prefork ``celery worker`` processes run for a
   fixed window; the tasks fetch their URL from one asyncio HTTP server bound to
   0.0.0.0, which records the address each connection was made to (the domain
   key is the URL host) and its arrival time. Then the same fleet runs again with
   pacing off on the same target: that is the worker capacity. Reported:
   requests/s, the ideal ``min(D / delay, capacity)``, the fraction of it, and
   the violations (two consecutive requests to one domain closer than its delay,
   as the target saw them) with the smallest gap.
2. **drain**: the scheduler's real claim throughput. A real ``celery beat -S
   celery_zsched`` (Redis broker, **no workers**, ``zsched_max_queued`` above N so
   backpressure never binds) drains a storm of N due jobs (default 20,000):
   promoted jobs/s from the first promote to the last (the store's ``promoted``
   counter, polled), pacing off vs pacing on with every job on its own domain
   (cap 1, delay 1 s: no job is held). Best of ``--drain-reps`` interleaved runs;
   the ratio on/off (goal >= 0.9).
3. **cost**: the Redis-only worst case: ``Store.claim`` in a loop (no broker, no
   publish) over N due jobs, pacing on with every job on its own domain vs pacing
   off: claimed jobs/s and the ratio; also pacing on with the jobs spread over D
   domains (most are held), for information. With nothing but the claim in the
   loop, pacing's extra Redis work is the largest share it can be of the cost.
4. **idle**: the latency of a claim with nothing due, pacing on vs off, at 10,000
   and 100,000 scheduled jobs.

Everything runs against throwaway ``redis-server`` processes (store and broker,
as ``bench.py`` does) on free ports; 127.0.0.1:6379 is never used. Every process
the script starts is stopped at the end, also on error, SIGTERM or Ctrl-C.

This is a script, not a test: nothing is asserted.

The same file is also the Celery app that the beat and worker processes load
(``celery -A pacing:app``, with this directory on ``PYTHONPATH``): see
:func:`__getattr__`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import multiprocessing as mp
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import (
    FLEET_APP_CONF,
    CeleryFleet,
    RedisServer,
    command_calls,
    command_delta,
    lazy_app,
    run_child,
)

PREFIX = "{pace}:"
WEEK_S = 7 * 86400.0  # the interval of every job: each fires at most once in a run
PARTS = ("fleet", "drain", "cost", "idle")
#: The goal for the claim's cost: pacing on claims at least this share of pacing off's rate.
BAR_COST_RATIO = 0.9
#: How often the drain part reads the store's ``promoted`` counter.
DRAIN_POLL_S = 0.005
#: Environment of the beat and worker processes (the ``ZSCHED_*`` settings go there too).
ENV_BROKER = "PACING_BENCH_BROKER_URL"
ENV_READY = "PACING_BENCH_READY_KEY"
#: What the target records of a request: (arrival, wall-clock s; the address the
#: client connected to; the Host header; the path).
Hit = tuple[float, str, str, str]


# --------------------------------------------------------------------- jobs
def host_of(domain: int) -> str:
    """The loopback address of domain number ``domain``: 127.1.0.1, 127.1.0.2, ...

    127.0.0.0/8 is all loopback on Linux, so each of these reaches the one server
    bound to 0.0.0.0, and each is a domain of its own (pacing keys on the URL host).
    127.0.x.y is left out so no domain is "localhost"'s 127.0.0.1.
    """
    if not 0 <= domain < 250 * 250 * 254:
        raise ValueError(f"domain number out of range: {domain}")
    return f"127.{1 + domain // 62_500}.{domain // 250 % 250}.{domain % 250 + 1}"


def job_rows(n: int, domains: int, port: int, tag: str) -> Iterator[dict[str, Any]]:
    """``n`` URL jobs, job i on domain ``i % domains`` (so a claim batch spans domains)."""
    for i in range(n):
        yield {"id": f"{tag}-{i}", "url": f"http://{host_of(i % domains)}:{port}/{tag}/{i}",
               "interval_s": WEEK_S, "jitter_s": 0}


def own_domain_rows(n: int, tag: str) -> Iterator[dict[str, Any]]:
    """``n`` URL jobs, each on a domain of its own (never fetched: the cost part has no worker)."""
    for i in range(n):
        yield {"id": f"{tag}-{i}", "url": f"http://d{i}.{tag}.example/x", "interval_s": WEEK_S,
               "jitter_s": 0}


def settings_for(store_url: str, pacing: bool, delay_s: float = 1.0, cap: int = 1,
                 **more: Any) -> Any:
    """zsched settings on the throwaway store; backpressure lifted (no worker drains)."""
    from celery_zsched.config import Settings

    return Settings(redis_url=store_url, key_prefix=PREFIX, pacing=pacing,
                    domain_delay_s=delay_s, domain_max_in_flight=cap,
                    max_queued=100_000_000, **more)


def load_jobs(store_url: str, rows: list[dict[str, Any]], pacing: bool, stagger: bool,
              delay_s: float = 1.0) -> dict[str, Any]:
    """Empty the store, then validate and upsert ``rows`` (as the importer does).

    The store's pacing setting matters here: a job's domain is written into its
    state at upsert only when pacing is on.
    """
    from celery_zsched.core.job import Defaults, Job
    from celery_zsched.store import Store

    settings = settings_for(store_url, pacing, delay_s)
    store = Store.from_settings(settings)
    store.client.flushdb()
    defaults = Defaults.from_settings(settings)
    started = time.perf_counter()
    jobs = [Job.from_dict(row, defaults, row=i) for i, row in enumerate(rows)]
    store.upsert_many(jobs, stagger=stagger, total=len(jobs))
    seconds = time.perf_counter() - started
    scheduled = int(store.client.zcard(store.keys.schedule))
    store.client.close()
    return {"n": len(rows), "seconds": seconds, "scheduled": scheduled}


# ------------------------------------------------------- the worker side app
def _make_app() -> Any:
    """The Celery app of the beat and worker processes, configured from the environment.

    The task ``scrape`` fetches its URL with one plain HTTP/1.1 request
    (``http.client``: the cheapest client, so the worker's own cost stays small)
    and raises ``JobFailed`` with the status on anything but 200.
    """
    import http.client
    from urllib.parse import urlsplit

    from celery import Celery, signals

    import celery_zsched.worker  # noqa: F401  (installs the start and settle hooks)
    from celery_zsched.core.errors import JobFailed

    app = Celery("zsched_pacing_bench", broker=os.environ[ENV_BROKER])
    app.conf.update(FLEET_APP_CONF)

    @app.task(name="scrape")
    def scrape(url: str, meta: dict[str, Any] | None = None) -> int:
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=10)
        try:
            conn.request("GET", parts.path or "/")
            response = conn.getresponse()
            response.read()
        finally:
            conn.close()
        if response.status != 200:
            raise JobFailed(f"HTTP {response.status}", status=response.status)
        return int(response.status)

    ready_key = os.environ.get(ENV_READY)

    def announce_ready(sender: Any = None, **_: Any) -> None:
        # The parent waits for every worker before it starts beat, so the window
        # never measures a worker still booting its pool.
        if ready_key:
            client = redis.Redis.from_url(os.environ["ZSCHED_REDIS_URL"])
            client.sadd(ready_key, str(getattr(sender, "hostname", os.getpid())))
            client.close()

    signals.worker_ready.connect(announce_ready, weak=False)
    return app


#: ``pacing.app``, built on first use, so only ``celery -A pacing:app`` processes
#: build it: the benchmark itself never needs the environment it reads.
__getattr__ = lazy_app(_make_app)


# ----------------------------------------------------------- the HTTP target
def _target_main(conn: Connection) -> None:
    """An HTTP server on 0.0.0.0 that answers 200 and records every request.

    A hit is (arrival time, the address the client connected to, the Host
    header, the path). The arrival time is taken when the connection is handed
    to the handler, on the wall clock: the same machine's clock Redis' TIME
    reads, so it compares with the start times the worker's settle records.
    asyncio keeps the cost per request far below a thread per connection.
    The parent talks over ``conn``:
    ``"count"`` -> (hits so far, time of the first, now), ``"stop"`` -> every hit.
    """
    hits: list[Hit] = []
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        arrived = time.time()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            host = ""
            lines = head.split(b"\r\n")
            path = lines[0].split(b" ")[1].decode("latin-1") if b" " in lines[0] else ""
            for line in lines[1:]:
                if line[:5].lower() == b"host:":
                    host = line[5:].strip().decode("latin-1").rsplit(":", 1)[0]
                    break
            hits.append((arrived, str(writer.get_extra_info("sockname")[0]), host, path))
            writer.write(reply)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(handle, "0.0.0.0", 0, backlog=4096)
        conn.send(("ok", server.sockets[0].getsockname()[1]))
        loop = asyncio.get_running_loop()
        while True:
            cmd = await loop.run_in_executor(None, conn.recv)
            if cmd == "count":
                conn.send(("ok", (len(hits), hits[0][0] if hits else None, time.time())))
            else:
                server.close()
                conn.send(("ok", hits))
                return

    try:
        asyncio.run(serve())
    except BaseException:
        conn.send(("err", traceback.format_exc()))


class Target:
    """Parent side of :func:`_target_main`."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_target_main, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.port: int = self._ask(None)

    def _ask(self, cmd: str | None) -> Any:
        if cmd is not None:
            self.conn.send(cmd)
        if not self.conn.poll(60):
            raise TimeoutError(f"HTTP target: no answer to {cmd}")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"HTTP target failed:\n{value}")
        return value

    def count(self) -> tuple[int, float | None, float]:
        count, first, now = self._ask("count")
        return int(count), first, float(now)

    def stop(self) -> list[Hit]:
        hits: list[Hit] = self._ask("stop")
        self.proc.join(10)
        return hits

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


# ------------------------------------------------------------------ the fleet
@dataclass(frozen=True)
class FleetCfg:
    """One run of beat + workers against the target."""

    store_url: str
    broker_url: str
    jobs: int
    domains: int
    delay_s: float
    workers: int
    concurrency: int
    window_s: float
    logdir: str
    #: A gap at the target shorter than the delay by more than this is reported apart.
    tolerance_s: float


class Fleet(CeleryFleet):
    """``celery beat -S celery_zsched`` and prefork ``celery worker`` subprocesses
    of ``pacing:app`` (see :class:`~bench.CeleryFleet`)."""

    def __init__(self, cfg: FleetCfg, pacing: bool, tag: str,
                 extra_env: dict[str, str] | None = None) -> None:
        self.cfg = cfg
        self.ready_key = f"pacebench:ready:{tag}"
        super().__init__("pacing:app", cfg.logdir, tag, {
            ENV_BROKER: cfg.broker_url, ENV_READY: self.ready_key,
            "ZSCHED_REDIS_URL": cfg.store_url, "ZSCHED_KEY_PREFIX": PREFIX,
            "ZSCHED_PACING": "true" if pacing else "false",
            "ZSCHED_DOMAIN_DELAY_S": str(cfg.delay_s), "ZSCHED_DOMAIN_MAX_IN_FLIGHT": "1",
            **(extra_env or {}),
        }, drop=("PACING_BENCH_",))

    def start_workers(self) -> None:
        for i in range(self.cfg.workers):
            self.start_worker(f"pace{i}", self.cfg.concurrency)
        client = redis.Redis.from_url(self.cfg.store_url)
        try:
            self.wait_ready(client, self.ready_key, self.cfg.workers)
        finally:
            client.close()


def gap_stats(by_domain: dict[str, list[float]], delay_s: float, tolerance_s: float,
              prefix: str = "") -> dict[str, Any]:
    """The gaps between consecutive times of each domain: count, violations, quantiles."""
    gaps: list[float] = []
    for times in by_domain.values():
        times.sort()
        gaps.extend(b - a for a, b in itertools.pairwise(times))
    gaps.sort()
    return {prefix + "gaps": len(gaps),
            prefix + "violations": sum(1 for g in gaps if g < delay_s),
            # How far under the delay the violations go: the starts are spaced in
            # Redis, each request leaves a few ms after its start, and that latency
            # varies; a gap short by more than the tolerance is pacing not holding.
            prefix + "violations_beyond_tolerance":
                sum(1 for g in gaps if g < delay_s - tolerance_s),
            prefix + "min_gap_s": gaps[0] if gaps else None,
            prefix + "p01_gap_s": gaps[int(len(gaps) * 0.01)] if gaps else None,
            prefix + "median_gap_s": statistics.median(gaps) if gaps else None}


def politeness(hits: list[Hit], starts: dict[str, float], delay_s: float,
               tolerance_s: float) -> dict[str, Any]:
    """Per domain (the address connected to), the gaps between consecutive requests.

    ``starts``: each job's start time (Redis clock, from its settle event). The
    same gaps between those starts show what the core enforced; the latency from
    start to arrival shows how much the request moved after it.
    """
    by_host: dict[str, list[float]] = defaultdict(list)
    start_by_host: dict[str, list[float]] = defaultdict(list)
    mismatched = 0
    latency: list[float] = []
    for at, addr, host, path in hits:
        by_host[addr].append(at)
        mismatched += addr != host  # the Host header names the address it was sent to
        job_id = path.strip("/").replace("/", "-")  # /paced/17 is job paced-17
        if job_id in starts:
            start_by_host[addr].append(starts[job_id])
            latency.append(at - starts[job_id])
    latency.sort()
    return {"requests": len(hits), "domains_hit": len(by_host), "host_mismatch": mismatched,
            **gap_stats(by_host, delay_s, tolerance_s),
            **gap_stats(start_by_host, delay_s, tolerance_s, "start_"),
            "starts_matched": len(latency),
            "latency_p50_s": statistics.median(latency) if latency else None,
            "latency_p99_s": latency[int(len(latency) * 0.99)] if latency else None,
            "latency_max_s": latency[-1] if latency else None}


def start_times(store_url: str) -> dict[str, float]:
    """Each settled job's start, wall-clock s (Redis TIME), from the settle events' payloads."""
    client = redis.Redis.from_url(store_url, decode_responses=True)
    out: dict[str, float] = {}
    last = "-"
    while True:
        rows: list[tuple[str, dict[str, str]]] = client.xrange(  # type: ignore[assignment]
            PREFIX + "events", min=last, count=10_000)
        for stream_id, fields in rows:
            started = json.loads(fields.get("data") or "{}").get("started_ms")
            if started:
                out[fields["id"]] = started / 1000
            last = "(" + stream_id
        if len(rows) < 10_000:
            break
    client.close()
    return out


def run_fleet(cfg: FleetCfg, pacing: bool, store: RedisServer, broker: RedisServer,
              log: Callable[[str], None]) -> dict[str, Any]:
    """Load the jobs (all due now), start workers then beat, count hits for the window."""
    tag = "paced" if pacing else "unpaced"
    broker.client().flushall()
    target = Target()
    fleet = Fleet(cfg, pacing, tag)
    try:
        rows = list(job_rows(cfg.jobs, cfg.domains, target.port, tag))
        loaded = run_child(load_jobs, cfg.store_url, rows, pacing, False, cfg.delay_s)
        log(f"fleet {tag}: {loaded['scheduled']:,} jobs loaded; starting "
            f"{cfg.workers} x {cfg.concurrency} prefork workers")
        fleet.start_workers()
        redis_cpu0 = _cpu_s(store, broker)
        procs_cpu0 = fleet.cpu_s()
        fleet.start_beat()
        started = time.monotonic()
        while True:  # the window opens with the first request the target sees
            fleet.check_alive()
            count, first, _now = target.count()
            if count:
                break
            if time.monotonic() - started > 120:
                raise TimeoutError(f"fleet {tag}: no request within 120 s")
            time.sleep(0.05)
        first_after_s = time.monotonic() - started
        log(f"fleet {tag}: first request {first_after_s:.1f}s after beat start; "
            f"measuring {cfg.window_s:g}s")
        time.sleep(cfg.window_s)
        fleet.check_alive()
        counters = store.client().hgetall(PREFIX + "counters")
        redis_cpu = _cpu_s(store, broker) - redis_cpu0
        procs_cpu = {k: v - procs_cpu0.get(k, 0.0) for k, v in fleet.cpu_s().items()}
        load = os.getloadavg()[0]
    finally:
        fleet.stop()
        try:
            hits = target.stop()
        finally:
            target.kill()
    assert first is not None
    in_window = sum(1 for hit in hits if first <= hit[0] < first + cfg.window_s)
    out = {"pacing": pacing, "jobs": cfg.jobs, "window_s": cfg.window_s, "in_window": in_window,
           "rate": in_window / cfg.window_s, "first_after_s": first_after_s,
           "counters": {k: int(v) for k, v in counters.items()},
           "redis_cpu_s": redis_cpu, "load_avg": load, "beat_cpu_s": procs_cpu["beat"],
           "workers_cpu_s": procs_cpu["workers"],
           **politeness(hits, start_times(cfg.store_url), cfg.delay_s, cfg.tolerance_s)}
    log(f"fleet {tag}: {out['rate']:,.0f} requests/s, {out['violations']} violations, "
        f"min gap {out['min_gap_s']}")
    return out


def _cpu_s(*servers: RedisServer) -> float:
    total = 0.0
    for server in servers:
        info = server.client().info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


# ------------------------------------------------------------------ the drain
def load_due(store_url: str, n: int, pacing: bool, tag: str) -> dict[str, Any]:
    """Empty the store, upsert ``n`` jobs each on its own domain, all due a second ago."""
    from celery_zsched.store import Store

    loaded = load_jobs(store_url, list(own_domain_rows(n, tag)), pacing, False)
    store = Store.from_settings(settings_for(store_url, pacing))
    now = store.now_ms()
    ids = [f"{tag}-{i}" for i in range(n)]
    for start in range(0, n, 10_000):
        store.client.zadd(store.keys.schedule, {i: now - 1000 for i in ids[start:start + 10_000]})
    store.client.close()
    return loaded


def run_drain(cfg: FleetCfg, n: int, pacing: bool, store: RedisServer, broker: RedisServer,
              tag: str, log: Callable[[str], None]) -> dict[str, Any]:
    """A real beat, no workers, drains ``n`` due jobs; promoted/s from first to last promote.

    The store's ``promoted`` counter (claim.lua adds each claim's jobs, just
    before the beat publishes them) is read every ``DRAIN_POLL_S``; the rate is
    the jobs promoted after the first reading that saw any, over the time from
    that reading to the one that saw all ``n``. A beat publishes each batch
    before it claims the next, so the rate includes the broker publish. Redis
    CPU (store + broker) is read over the same span, polling included.
    """
    broker.client().flushall()
    loaded = run_child(load_due, cfg.store_url, n, pacing, tag)
    fleet = Fleet(cfg, pacing, tag, {"ZSCHED_MAX_QUEUED": str(10 * n + 100_000_000)})
    client = store.client()
    key = PREFIX + "counters"
    try:
        redis_cpu0 = 0.0
        fleet.start_beat()
        started = time.monotonic()
        clock = time.monotonic
        first: tuple[float, int] | None = None
        while True:
            got = int(client.hget(key, "promoted") or 0)
            at = clock()
            if got and first is None:
                first = (at, got)
                redis_cpu0 = _cpu_s(store, broker)
            if got >= n:
                break
            if at - started > 300:
                raise TimeoutError(f"drain {tag}: {got:,} of {n:,} promoted in 300 s")
            if first is None:
                fleet.check_alive()
            time.sleep(DRAIN_POLL_S)
        last = at
        redis_cpu = _cpu_s(store, broker) - redis_cpu0
        # The last batch is published after its claim: wait for it (not timed).
        bclient = broker.client()
        while (queued := int(bclient.llen("celery"))) < n and clock() - last < 30:
            time.sleep(DRAIN_POLL_S)
        published_after_s = clock() - last
        bclient.close()
        counters = {(k.decode() if isinstance(k, bytes) else str(k)): int(v)
                    for k, v in client.hgetall(key).items()}
        fleet.check_alive()
    finally:
        fleet.stop()
    assert first is not None
    seconds = last - first[0]
    rate = (got - first[1]) / seconds if seconds > 0 else float("inf")
    out = {"pacing": pacing, "n": n, "loaded": loaded["scheduled"], "seconds": seconds,
           "first_seen": first[1], "promoted_per_s": rate,
           "first_after_s": first[0] - started,
           "counters": counters, "broker_queued": queued, "redis_cpu_s": redis_cpu,
           "published_after_s": published_after_s,
           "redis_us_per_job": redis_cpu / max(1, got - first[1]) * 1e6,
           "domain_records": int(client.hlen(PREFIX + "domains"))}
    client.close()
    log(f"drain {tag}: {rate:,.0f} promoted/s, {seconds:.2f}s, "
        f"{counters.get('held', 0):,} held, {queued:,} in the broker")
    return out


def drain(cfg: FleetCfg, n: int, reps: int, store: RedisServer, broker: RedisServer,
          log: Callable[[str], None]) -> dict[str, Any]:
    """Best of ``reps`` runs of each side, interleaved (off, on, off, on, ...)."""
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for rep in range(reps):
        for key, pacing in (("off", False), ("on", True)):
            runs[key].append(run_drain(cfg, n, pacing, store, broker,
                                       f"drain-{key}{rep}", log))
    best = {k: max(v, key=lambda r: r["promoted_per_s"]) for k, v in runs.items()}
    return {"best": best, "runs": runs}


# ----------------------------------------------------------------- the cost
def claim_loop(store_url: str, n: int, domains: int, pacing: bool, tag: str) -> dict[str, Any]:
    """Load ``n`` due jobs, then ``Store.claim`` until nothing is due now (timed).

    ``domains`` 0: every job on its own domain. With pacing on and fewer domains
    than jobs most claims hold jobs back (moved to their domain's next slots, in
    the future), so the loop ends once every due job was claimed or held.
    """
    from celery_zsched.core.job import Defaults, Job
    from celery_zsched.store import Store

    settings = settings_for(store_url, pacing)
    store = Store.from_settings(settings)
    store.client.flushdb()
    defaults = Defaults.from_settings(settings)
    rows = own_domain_rows(n, tag) if domains == 0 else job_rows(n, domains, 80, tag)
    store.upsert_many([Job.from_dict(r, defaults, row=i) for i, r in enumerate(rows)],
                      stagger=False, total=n)
    now = store.now_ms()
    # Due a second ago, all of them: the claim sees them as due at once.
    ids = [f"{tag}-{i}" for i in range(n)]
    for start in range(0, n, 10_000):
        store.client.zadd(store.keys.schedule, {i: now - 1000 for i in ids[start:start + 10_000]})
    claimed = held = claims = 0
    gc.collect()
    gc.disable()  # the claims allocate little; keep a collection out of the timing
    try:
        cpu0, redis0 = time.process_time(), _info_cpu(store.client)
        started = time.perf_counter()
        while True:
            batch = store.claim()
            claims += 1
            claimed += len(batch.jobs)
            held += batch.held
            if batch.taken == 0:
                break
        seconds = time.perf_counter() - started
        cpu, redis_cpu = time.process_time() - cpu0, _info_cpu(store.client) - redis0
    finally:
        gc.enable()
    domain_records = int(store.client.hlen(store.keys.domains))
    store.client.close()
    return {"n": n, "domains": domains or n, "pacing": pacing, "claimed": claimed, "held": held,
            "claims": claims, "seconds": seconds, "claimed_per_s": claimed / seconds,
            "taken_per_s": (claimed + held) / seconds, "client_cpu_s": cpu,
            "redis_cpu_s": redis_cpu, "redis_us_per_job": redis_cpu / max(1, claimed + held) * 1e6,
            "domain_records": domain_records}


def _info_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def cost(store_url: str, n: int, domains: int, reps: int,
         log: Callable[[str], None]) -> dict[str, Any]:
    """Best of ``reps`` (interleaved, so a noisy minute hits both sides) for each case."""
    cases = {"off": (0, False), "own": (0, True), "shared": (domains, True)}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in cases}
    for rep in range(reps):
        for key, (doms, pacing) in cases.items():
            res = run_child(claim_loop, store_url, n, doms, pacing, f"c{key}")
            runs[key].append(res)
            log(f"cost rep {rep + 1}/{reps} {key}: {res['claimed_per_s']:,.0f} claimed/s, "
                f"{res['held']:,} held, {res['seconds']:.2f}s")
    best = {k: max(v, key=lambda r: r["taken_per_s"]) for k, v in runs.items()}
    return {"best": best, "runs": runs}


# ----------------------------------------------------------------- idle claim
def idle_claims(store_url: str, n: int, domains: int, pacing: bool, ticks: int,
                sleep_s: float) -> dict[str, Any]:
    """``ticks`` timed ``Store.claim`` calls with none of ``n`` staggered jobs due."""
    from celery_zsched.store import Store

    rows = list(job_rows(n, domains, 80, "idle"))
    load_jobs(store_url, rows, pacing, True)
    store = Store.from_settings(settings_for(store_url, pacing))
    drained = 0
    while (batch := store.claim()).taken:  # what the stagger made due now
        drained += batch.taken
    for _ in range(20):  # warm: connection, scripts loaded
        store.claim()
    times: list[float] = []
    clock = time.perf_counter
    fell_due = 0
    before = command_calls(store.client)
    for _ in range(ticks):
        time.sleep(sleep_s)  # as a beat sleeps between ticks; not a hot loop
        t0 = clock()
        batch = store.claim()
        times.append(clock() - t0)
        fell_due += batch.taken
    calls = command_delta(before, command_calls(store.client))
    store.client.close()
    ms = sorted(t * 1000 for t in times)
    return {"n": n, "pacing": pacing, "ticks": ticks, "p50_ms": statistics.median(ms),
            "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))], "drained_first": drained,
            "fell_due": fell_due, "cmds_per_claim": sum(calls.values()) / ticks}


# -------------------------------------------------------------------- tables
def _f(value: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if value is None else fmt.format(value)


def render_fleet(paced: dict[str, Any], unpaced: dict[str, Any] | None,
                 cfg: FleetCfg) -> str:
    lines = [f"Fleet: {cfg.jobs:,} jobs over {cfg.domains:,} domains, delay {cfg.delay_s:g} s, "
             f"cap 1; {cfg.workers} prefork workers x {cfg.concurrency}; window {cfg.window_s:g} s",
             "", "| metric | pacing on | pacing off (capacity) |", "|---|---|---|"]

    def row(name: str, fmt: Callable[[dict[str, Any]], str]) -> None:
        lines.append(f"| {name} | {fmt(paced)} | {fmt(unpaced) if unpaced else '-'} |")

    row("jobs loaded (all due at start)", lambda r: f"{r['jobs']:,}")
    row("requests/s in the window", lambda r: f"{r['rate']:,.1f}"
        + (" (every job done: a lower bound)" if r["requests"] >= r["jobs"] else ""))
    row("requests in the window / whole run", lambda r: f"{r['in_window']:,} / {r['requests']:,}")
    row("first request after beat start, s", lambda r: f"{r['first_after_s']:.1f}")
    row("domains hit", lambda r: f"{r['domains_hit']:,}")
    pace_ideal = cfg.domains / cfg.delay_s if cfg.delay_s > 0 else float("inf")
    capacity = unpaced["rate"] if unpaced else None
    ideal = min(pace_ideal, capacity) if capacity else pace_ideal
    lines.append(f"| ideal min(domains / delay, capacity) | {ideal:,.1f} "
                 f"(= min({pace_ideal:,.0f}, {_f(capacity, '{:,.1f}')})) | - |")
    lines.append(f"| fraction of ideal | {paced['rate'] / ideal:.2f} | - |")
    row(f"violations (consecutive requests to one domain < {cfg.delay_s:g} s apart)",
        lambda r: f"{r['violations']:,} of {r['gaps']:,} gaps")
    row(f"violations beyond {cfg.tolerance_s * 1000:g} ms (gap < {cfg.delay_s:g} s - "
        f"{cfg.tolerance_s * 1000:g} ms)", lambda r: f"{r['violations_beyond_tolerance']:,}")
    row("min gap s (per domain, at the target)", lambda r: _f(r["min_gap_s"]))
    row("1st percentile / median gap s", lambda r: f"{_f(r['p01_gap_s'])} / "
        f"{_f(r['median_gap_s'])}")
    row("violations between the starts (Redis clock, settle events)",
        lambda r: f"{r['start_violations']:,} of {r['start_gaps']:,} gaps")
    row("min gap between the starts s", lambda r: _f(r["start_min_gap_s"]))
    row("start -> arrival at the target s, p50 / p99 / max",
        lambda r: f"{_f(r['latency_p50_s'], '{:.4f}')} / {_f(r['latency_p99_s'], '{:.4f}')} / "
                  f"{_f(r['latency_max_s'], '{:.4f}')}")
    row("Host header != address connected to", lambda r: str(r["host_mismatch"]))
    row("held by the claim / deferred at start", lambda r: f"{r['counters'].get('held', 0):,} / "
        f"{r['counters'].get('deferred', 0):,}")
    row("promoted / started / complete / error (store counters)",
        lambda r: "{:,} / {:,} / {:,} / {:,}".format(
            *(r["counters"].get(k, 0) for k in ("promoted", "started", "complete", "error"))))
    row("duplicates dropped at start", lambda r: f"{r['counters'].get('duplicates', 0):,}")
    row("Redis CPU s, store + broker, in the window", lambda r: f"{r['redis_cpu_s']:.1f}")
    row("beat / workers CPU s, beat start to window end",
        lambda r: f"{r['beat_cpu_s']:.1f} / {r['workers_cpu_s']:.1f}")
    row("load average at the window's end", lambda r: f"{r['load_avg']:.2f}")
    return "\n".join(lines)


def render_drain(res: dict[str, Any], cfg: FleetCfg) -> str:
    best = res["best"]
    off, on = best["off"], best["on"]
    ratio = on["promoted_per_s"] / off["promoted_per_s"]
    lines = [f"Drain: a real celery beat -S celery_zsched, Redis broker, no workers, "
             f"{off['n']:,} due jobs each on its own domain (pacing on: cap 1, delay "
             f"{cfg.delay_s:g} s, none held); max_queued above N; best of "
             f"{len(res['runs']['off'])} (interleaved)",
             "", "| case | promoted | held | s, first to last promote | promoted jobs/s "
             "| Redis CPU us/job, store + broker, same span | in the broker | domain records |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in (("pacing off", off), ("pacing on, every job its own domain", on)):
        c = r["counters"]
        lines.append(f"| {name} | {c.get('promoted', 0):,} | {c.get('held', 0):,} | "
                     f"{r['seconds']:.2f} | {r['promoted_per_s']:,.0f} | "
                     f"{r['redis_us_per_job']:.1f} | {r['broker_queued']:,} | "
                     f"{r['domain_records']:,} |")
    verdict = "PASS" if ratio >= BAR_COST_RATIO else "FAIL"
    lines.append(f"| drain ratio, pacing on / off, promoted/s | {ratio:.2f} {verdict} "
                 f"(goal >= {BAR_COST_RATIO}) | | | | "
                 f"{on['redis_us_per_job'] / off['redis_us_per_job']:.2f}x | | |")
    return "\n".join(lines)


def render_cost(res: dict[str, Any], domains: int) -> str:
    best = res["best"]
    off, own, shared = best["off"], best["own"], best["shared"]
    ratio = own["claimed_per_s"] / off["claimed_per_s"]
    lines = [f"Claim cost, the Redis-only worst case: Store.claim in a loop, {off['n']:,} due "
             f"jobs, batch 1,000, no broker, no publish; best of {len(res['runs']['off'])} "
             "(interleaved)",
             "", "| case | claimed | held | s | due jobs/s (claimed + held) "
             "| client CPU us/job | Redis CPU us/job | domain records |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in (("pacing off", off), ("pacing on, every job its own domain", own),
                    (f"pacing on, {domains:,} domains (info)", shared)):
        taken = max(1, r["claimed"] + r["held"])
        lines.append(f"| {name} | {r['claimed']:,} | {r['held']:,} | {r['seconds']:.2f} | "
                     f"{r['taken_per_s']:,.0f} | {r['client_cpu_s'] / taken * 1e6:.1f} | "
                     f"{r['redis_us_per_job']:.1f} | {r['domain_records']:,} |")
    verdict = "PASS" if ratio >= BAR_COST_RATIO else "FAIL"
    # The loop is serial (the client decodes a batch, then Redis runs the next
    # claim), so the wall ratio is about (client + Redis off) / (client + Redis on).
    lines.append(f"| cost ratio, pacing on (own domains) / off, claimed/s | {ratio:.2f} {verdict} "
                 f"(goal >= {BAR_COST_RATIO}) | | | | | "
                 f"{own['redis_us_per_job'] / off['redis_us_per_job']:.2f}x Redis CPU/job | |")
    return "\n".join(lines)


def render_idle(res: list[dict[str, Any]], ticks: int) -> str:
    sizes = sorted({r["n"] for r in res})
    get = {(r["n"], r["pacing"]): r for r in res}
    lines = [f"Idle claim: {ticks} Store.claim calls 1 ms apart, none due", "",
             "| N scheduled | p50 ms off | p50 ms on | p99 ms off | p99 ms on | on/off p50 "
             "| commands/claim off / on | fell due |",
             "|---|---|---|---|---|---|---|---|"]
    for n in sizes:
        off, on = get[(n, False)], get[(n, True)]
        lines.append(f"| {n:,} | {off['p50_ms']:.3f} | {on['p50_ms']:.3f} | {off['p99_ms']:.3f} "
                     f"| {on['p99_ms']:.3f} | {on['p50_ms'] / off['p50_ms']:.2f}x | "
                     f"{off['cmds_per_claim']:.1f} / {on['cmds_per_claim']:.1f} | "
                     f"{off['fell_due'] + on['fell_due']} |")
    return "\n".join(lines)


# --------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 5,000 jobs over 100 domains, 15 s windows, "
                             "drain N 2,000 once, cost N 10,000 once, idle at 1,000 and "
                             "10,000 (options given explicitly still win)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="which parts to run, of " + ",".join(PARTS))
    parser.add_argument("--jobs", type=int, help="fleet: jobs (default 100,000)")
    parser.add_argument("--domains", type=int, help="fleet and cost: domains (default 1,000)")
    parser.add_argument("--delay-s", type=float, default=1.0,
                        help="fleet and drain: zsched_domain_delay_s (default 1)")
    parser.add_argument("--workers", type=int, default=2, help="fleet: worker processes")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="fleet: prefork children per worker (default 4)")
    parser.add_argument("--tolerance-ms", type=float, default=50.0,
                        help="fleet: gaps at the target shorter than the delay by more than "
                             "this are counted apart (default 50)")
    parser.add_argument("--window-s", type=float, help="fleet: measured window (default 60)")
    parser.add_argument("--capacity-window-s", type=float,
                        help="fleet: window of the pacing-off run (default: --window-s)")
    parser.add_argument("--capacity-jobs", type=int,
                        help="fleet: jobs of the pacing-off run; enough that the window "
                             "ends before they do (default: --jobs; 20,000 with --quick)")
    parser.add_argument("--drain-jobs", type=int, help="drain: due jobs (default 20,000)")
    parser.add_argument("--drain-reps", type=int,
                        help="drain: runs of each side, best kept (default 2)")
    parser.add_argument("--cost-jobs", type=int, help="cost: due jobs (default 100,000)")
    parser.add_argument("--reps", type=int, help="cost: repetitions, best kept (default 3)")
    parser.add_argument("--idle-sizes", help="idle: comma-separated N (default 10000,100000)")
    parser.add_argument("--idle-ticks", type=int, help="idle: timed claims (default 1000)")
    parser.add_argument("--json", help="also write raw results to this file")
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {"jobs": (5_000, 100_000), "domains": (100, 1_000), "window_s": (15.0, 60.0),
                "drain_jobs": (2_000, 20_000), "drain_reps": (1, 2),
                "cost_jobs": (10_000, 100_000), "reps": (1, 3),
                "idle_sizes": ("1000,10000", "10000,100000"), "idle_ticks": (200, 1000)}
    for name, (small, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    if args.capacity_jobs is None:
        args.capacity_jobs = 20_000 if quick else args.jobs
    if args.capacity_window_s is None:
        args.capacity_window_s = args.window_s
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if parts - set(PARTS):
        raise SystemExit(f"unknown parts {sorted(parts - set(PARTS))}; known: {PARTS}")
    started = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {msg}", file=sys.stderr, flush=True)

    servers: list[RedisServer] = []
    results: dict[str, Any] = {"args": vars(args)}
    tables: list[str] = []
    # Turn SIGTERM into an exception so the finally blocks stop every process.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logdir = tempfile.mkdtemp(prefix="zsched-pacing-bench-")
    try:
        store = RedisServer("store").start()
        servers.append(store)
        broker = RedisServer("broker").start()
        servers.append(broker)
        log(f"store redis on :{store.port}, broker redis on :{broker.port}; logs in {logdir}")
        if "fleet" in parts:
            cfg = FleetCfg(store.url(), broker.url(), args.jobs, args.domains, args.delay_s,
                           args.workers, args.concurrency, args.window_s, logdir,
                           args.tolerance_ms / 1000)
            paced = run_fleet(cfg, True, store, broker, log)
            capacity_cfg = FleetCfg(**{**asdict(cfg), "window_s": args.capacity_window_s,
                                       "jobs": args.capacity_jobs})
            unpaced = run_fleet(capacity_cfg, False, store, broker, log)
            results["fleet"] = {"paced": paced, "unpaced": unpaced, "cfg": asdict(cfg)}
            tables.append(render_fleet(paced, unpaced, cfg))
        if "drain" in parts:
            drain_cfg = FleetCfg(store.url(), broker.url(), args.drain_jobs, args.drain_jobs,
                                 args.delay_s, 0, 0, 0.0, logdir, args.tolerance_ms / 1000)
            results["drain"] = drain(drain_cfg, args.drain_jobs, args.drain_reps, store, broker,
                                     log)
            tables.append(render_drain(results["drain"], drain_cfg))
        if "cost" in parts:
            results["cost"] = cost(store.url(), args.cost_jobs, args.domains, args.reps, log)
            tables.append(render_cost(results["cost"], args.domains))
        if "idle" in parts:
            idle = []
            for n in [int(s.replace("_", "")) for s in args.idle_sizes.split(",") if s.strip()]:
                for pacing in (False, True):
                    res = run_child(idle_claims, store.url(), n, args.domains, pacing,
                                    args.idle_ticks, 0.001)
                    log(f"idle N={n:,} pacing {'on' if pacing else 'off'}: "
                        f"p50 {res['p50_ms']:.3f} ms")
                    idle.append(res)
            results["idle"] = idle
            tables.append(render_idle(idle, args.idle_ticks))
    finally:
        for server in servers:
            server.stop()
    print("\n\n".join(tables))
    print(f"\n(total {time.monotonic() - started:.0f}s; python {sys.version.split()[0]}, "
          f"{psutil.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.2f}; "
          f"worker logs in {logdir})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
