"""Change-aware recrawl against a simulated site: fixed interval vs adaptive (issue 22).

The site: ``--pages`` pages spread over ``--domains`` loopback "domains"
(127.0.1.x), each changing as a Poisson process whose rate is drawn
log-uniformly over three orders of magnitude (``--rate-min`` .. 1000 x it, per
second: time is scaled so a run fits in minutes). Pages answer with an ``ETag``
and a ``Last-Modified`` and honour ``If-None-Match`` (304, no body).

The runs: a real ``celery beat -S celery_zsched`` and prefork ``celery worker``
fetch every page, the task sending ``validators()`` and reporting the ETag as
the content signature and the ``Last-Modified`` (which dates a change: the
dated change-rate estimate), a 304 as a visit without change. The fetch budget
is what the fixed interval ``--interval-s`` spends: the regime where a polite
crawler cannot fetch every page as often as it changes (pacing, not the fleet,
is the limit). Rates default to 1-1000 changes a fixed interval.

1. **fixed, same fetches**: every page at ``--interval-s`` (the competitors'
   row: no other scheduler adapts);
2. **fixed, 2x fetches**: at half that interval. The fixed policy's fetches at an
   adaptive run's freshness are interpolated (log-linear) from 1 and 2;
3. **allocation**: ``recrawl: adaptive`` under Cho's allocation
   (``zsched_recrawl_allocation``), between a tenth and ten times the interval,
   each domain paced at the delay that allows the fixed interval's fetches (its
   budget), the capacity planner re-solving each domain's multiplier every
   interval;
4. with ``--with-target``, **adaptive** at ``--target`` freshness on that budget.

After ``--warmup-s`` (not measured) each run measures ``--measure-s``: the
time-averaged freshness (the share of page-time a fetched copy equalled its
page, from the site's own change times and fetch log), fetches, 304s and
bytes. The goal (issue 22): at the fixed policy's freshness adaptive uses at
most 60 % of its fetches, or at equal fetches its freshness is at least 1.2x.
``--quick``: a small site and short runs (the smoke test runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import FLEET_APP_CONF, CeleryFleet, RedisServer, lazy_app

PREFIX = "{fresh}:"
ENV_BROKER = "FRESH_BENCH_BROKER_URL"
ENV_READY = "FRESH_BENCH_READY_KEY"
BODY = b"x" * 2048
#: The runs whose jobs adapt (the others are fixed).
ADAPTS = ("adaptive", "allocation")
#: A fetch in the log: (wall-clock s, page, status, body bytes).
Fetch = tuple[float, int, int, int]


# ------------------------------------------------------------------ the site
def change_times(pages: int, rate_min: float, horizon_s: float, seed: int
                 ) -> tuple[list[float], list[list[float]]]:
    """Each page's rate (per s) and its change times (s from the start), Poisson."""
    rng = random.Random(seed)
    rates = [rate_min * 10 ** rng.uniform(0, 3) for _ in range(pages)]
    times: list[list[float]] = []
    for rate in rates:
        t, out = 0.0, []
        while True:
            t += rng.expovariate(rate)
            if t > horizon_s:
                break
            out.append(t)
        times.append(out)
    return rates, times


def _site_main(conn: Connection, changes: list[list[float]]) -> None:
    """The site's HTTP server (0.0.0.0, any 127.x address reaches it); ``"start"``
    sets its clock's zero, ``"stop"`` returns the fetch log."""
    log: list[Fetch] = []
    zero = [time.time()]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            now = time.time()
            lines = head.split(b"\r\n")
            page = int(lines[0].split(b" ")[1].rsplit(b"/", 1)[1])
            match = next((line.split(b":", 1)[1].strip() for line in lines[1:]
                          if line[:14].lower() == b"if-none-match:"), None)
            version = bisect.bisect_right(changes[page], now - zero[0])
            etag = f'"{page}-{version}"'.encode()
            modified = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(
                zero[0] + (changes[page][version - 1] if version else 0))).encode()
            headers = b"ETag: " + etag + b"\r\nLast-Modified: " + modified + b"\r\n"
            if match == etag:
                writer.write(b"HTTP/1.1 304 Not Modified\r\n" + headers
                             + b"Connection: close\r\n\r\n")
                log.append((now, page, 304, 0))
            else:
                writer.write(b"HTTP/1.1 200 OK\r\n" + headers + b"Content-Length: "
                             + str(len(BODY)).encode() + b"\r\nConnection: close\r\n\r\n" + BODY)
                log.append((now, page, 200, len(BODY)))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError):
            pass
        finally:
            writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(handle, "0.0.0.0", 0, backlog=4096)
        conn.send(("ok", server.sockets[0].getsockname()[1]))
        loop = asyncio.get_running_loop()
        while True:
            cmd = await loop.run_in_executor(None, conn.recv)
            if cmd == "start":
                zero[0] = time.time()
                log.clear()
                conn.send(("ok", zero[0]))
            else:
                server.close()
                conn.send(("ok", log))
                return

    try:
        asyncio.run(serve())
    except BaseException:
        conn.send(("err", traceback.format_exc()))


class Site:
    """Parent side of :func:`_site_main`."""

    def __init__(self, changes: list[list[float]]) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_site_main, args=(child, changes), daemon=True)
        self.proc.start()
        child.close()
        self.port: int = self._ask(None)

    def _ask(self, cmd: str | None) -> Any:
        if cmd is not None:
            self.conn.send(cmd)
        if not self.conn.poll(120):
            raise TimeoutError(f"site: no answer to {cmd}")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"site failed:\n{value}")
        return value

    def start(self) -> float:
        return float(self._ask("start"))

    def stop(self) -> list[Fetch]:
        log: list[Fetch] = self._ask("stop")
        self.proc.join(10)
        return log


# ------------------------------------------------------------------ the app
def _make_app() -> Any:
    """The fleet's Celery app: ``scrape`` fetches conditionally and reports what it saw."""
    import http.client
    from urllib.parse import urlsplit

    from celery import Celery, signals

    import celery_zsched.worker
    from celery_zsched.worker import report

    app = Celery("zsched_fresh_bench", broker=os.environ[ENV_BROKER])
    app.conf.update(FLEET_APP_CONF)

    @app.task(name="scrape")
    def scrape(url: str, meta: dict[str, Any] | None = None) -> int:
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=10)
        try:
            conn.request("GET", parts.path, headers=celery_zsched.worker.validators())
            response = conn.getresponse()
            response.read()
        finally:
            conn.close()
        if response.status == 304:
            report("complete", status=304)
        else:
            etag = response.getheader("ETag")
            report("complete", status=response.status, signature=etag, etag=etag,
                   last_modified=response.getheader("Last-Modified"))
        return int(response.status)

    ready_key = os.environ.get(ENV_READY)

    def announce_ready(sender: Any = None, **_: Any) -> None:
        if ready_key:
            client = redis.Redis.from_url(os.environ["ZSCHED_REDIS_URL"])
            client.sadd(ready_key, str(getattr(sender, "hostname", os.getpid())))
            client.close()

    signals.worker_ready.connect(announce_ready, weak=False)
    return app


__getattr__ = lazy_app(_make_app)


# ------------------------------------------------------------------ measuring
@dataclass(frozen=True)
class RunResult:
    """One run's measured window."""

    policy: str
    interval_s: float
    freshness: float
    fetches: int
    not_modified: int
    bytes: int
    #: Fetches a fixed policy asked for in the window (pages x window / interval):
    #: more than ``fetches`` means the fleet could not keep up.
    demanded: int = 0


def measure(policy: str, interval_s: float, log: list[Fetch], zero: float,
            changes: list[list[float]], start_s: float, end_s: float) -> RunResult:
    """Time-averaged freshness over [start_s, end_s] (s from the site's zero)."""
    by_page: list[list[float]] = [[] for _ in changes]
    fetches = not_modified = size = 0
    for at, page, status, body in log:
        t = at - zero
        by_page[page].append(t)
        if start_s <= t <= end_s:
            fetches += 1
            not_modified += status == 304
            size += body
    fresh = 0.0
    for page, times in enumerate(by_page):
        times.sort()
        marks = [*times, math.inf]
        for k, fetched in enumerate(times):
            nxt = marks[k + 1]
            if nxt < start_s or fetched > end_s:
                continue
            i = bisect.bisect_right(changes[page], fetched)
            stale_at = changes[page][i] if i < len(changes[page]) else math.inf
            lo, hi = max(fetched, start_s), min(stale_at, nxt, end_s)
            fresh += max(0.0, hi - lo)
    total = len(changes) * (end_s - start_s)
    adapts = policy in ADAPTS
    demanded = 0 if adapts else round(len(changes) * (end_s - start_s) / interval_s)
    return RunResult(policy, interval_s, fresh / total, fetches, not_modified, size, demanded)


# ------------------------------------------------------------------ running
@dataclass(frozen=True)
class Cfg:
    pages: int
    domains: int
    rate_min: float
    interval_s: float
    target: float
    warmup_s: float
    measure_s: float
    workers: int
    concurrency: int
    seed: int


def run(cfg: Cfg, policy: str, interval_s: float, changes: list[list[float]],
        logdir: str, tag: str, budget_delay_s: float | None = None) -> RunResult:
    """One run against a fresh store, broker and site. ``budget_delay_s``: each domain
    paced at that delay (its fetch budget); the ``allocation`` run spends it by Cho's
    allocation, the ``adaptive`` run at the freshness target."""
    from celery_zsched.config import Settings
    from celery_zsched.core.job import Defaults, Job
    from celery_zsched.services import planner
    from celery_zsched.store import Store

    paced: dict[str, Any] = ({} if budget_delay_s is None else {
        "pacing": True, "domain_delay_s": budget_delay_s,
        "recrawl_allocation": policy == "allocation",
        # The budget is the delay alone: no cap on requests in flight, no start margin
        # (the unpaced runs have neither).
        "domain_max_in_flight": 0, "domain_start_margin_s": 0})

    store_srv, broker = RedisServer("store").start(), RedisServer("broker").start()
    site = Site(changes)
    fleet = CeleryFleet("freshness:app", logdir, tag, {
        ENV_BROKER: broker.url(), ENV_READY: f"freshbench:ready:{tag}",
        "ZSCHED_REDIS_URL": store_srv.url(), "ZSCHED_KEY_PREFIX": PREFIX,
        "ZSCHED_FRESHNESS_TARGET": str(cfg.target),
        **{f"ZSCHED_{k.upper()}": str(v).lower() for k, v in paced.items()}},
        drop=("FRESH_BENCH_",))
    try:
        store = Store.from_settings(Settings(redis_url=store_srv.url(), key_prefix=PREFIX,
                                             **paced))
        extra = ({"recrawl": "adaptive", "min_interval_s": interval_s / 10,
                  "max_interval_s": interval_s * 10} if policy in ADAPTS else {})
        jobs = [Job.from_dict({"id": f"p{i}", "task": "scrape", "interval_s": interval_s,
                               "url": f"http://127.0.1.{1 + i % cfg.domains}:{site.port}/p/{i}",
                               "jitter_s": 0, **extra}, Defaults())
                for i in range(cfg.pages)]
        for i in range(cfg.workers):
            fleet.start_worker(f"w{i}", cfg.concurrency)
        fleet.wait_ready(store_srv.client(), f"freshbench:ready:{tag}", cfg.workers)
        zero = site.start()
        store.upsert_many(jobs)  # staggered over one interval
        fleet.start_beat()
        deadline = time.monotonic() + cfg.warmup_s + cfg.measure_s
        replan = time.monotonic()
        while time.monotonic() < deadline:
            fleet.check_alive()
            if policy == "allocation" and time.monotonic() >= replan:
                # The planner's scan (the exporter runs it every zsched_planner_refresh_s),
                # as often as the rates move: every interval.
                planner.demand(store, fresh=True)
                replan = time.monotonic() + cfg.interval_s
            time.sleep(0.5)
        fleet.stop()
        log = site.stop()
    finally:
        fleet.stop()
        if site.proc.is_alive():
            site.proc.kill()
        store_srv.stop()
        broker.stop()
    return measure(policy, interval_s, log, zero, changes, cfg.warmup_s,
                   cfg.warmup_s + cfg.measure_s)


def interpolate_fetches(a: RunResult, b: RunResult, freshness: float) -> float:
    """Fixed-policy fetches at ``freshness``, log-linear between runs ``a`` and ``b``."""
    if a.freshness == b.freshness:
        return float(max(a.fetches, b.fetches))
    share = (freshness - a.freshness) / (b.freshness - a.freshness)
    return math.exp(math.log(a.fetches) + share * (math.log(b.fetches) - math.log(a.fetches)))


def render(rows: list[RunResult], loaded: str) -> str:
    """The table, then each adaptive run against the fixed interval (the first two rows
    are the fixed runs at the budget and at twice it)."""
    same, double = rows[0], rows[1]
    lines = [
        "| policy | interval | freshness | fetches | 304s | bytes |",
        "|---|---|---|---|---|---|",
        *(f"| {r.policy} | {r.interval_s:g} s | {r.freshness:.3f} | {r.fetches:,} | "
          f"{r.not_modified:,} | {r.bytes:,} |" for r in rows),
        "",
    ]
    for run in rows[2:]:
        needed = interpolate_fetches(same, double, run.freshness)
        lines += [
            f"{run.policy}: freshness {run.freshness / same.freshness:.2f}x the fixed "
            f"interval's at {run.fetches / max(same.fetches, 1):.2f}x its fetches "
            f"(goal >= 1.2x at equal fetches)",
            f"{run.policy}: fetches {run.fetches / needed:.2f}x what the fixed interval needs "
            f"for its freshness (interpolated; goal <= 0.6)",
        ]
    lines.append(loaded)
    short = [r for r in (same, double) if r.fetches < 0.9 * r.demanded]
    if short:
        lines.append("CAPACITY-LIMITED: " + ", ".join(
            f"{r.policy} made {r.fetches:,} of {r.demanded:,} fetches" for r in short)
            + " (the fleet could not keep up: the ratios above understate the fixed policy)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="A small site, short runs.")
    parser.add_argument("--pages", type=int, default=1_000)
    parser.add_argument("--domains", type=int, default=10)
    parser.add_argument("--rate-min", type=float, default=None,
                        help="Slowest change rate per s (default: 1 / interval).")
    parser.add_argument("--interval-s", type=float, default=30.0,
                        help="The fixed interval; the budget is what it spends "
                             "(the adaptive bounds: /10, x10).")
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--with-target", action="store_true",
                        help="Also run adaptive at --target on the same budget.")
    parser.add_argument("--warmup-s", type=float, default=240.0)
    parser.add_argument("--measure-s", type=float, default=240.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--json", type=Path, help="Also write the results here.")
    args = parser.parse_args(argv)
    if args.quick:
        args.pages, args.domains, args.interval_s = min(args.pages, 100), 4, 4.0
        args.warmup_s, args.measure_s = 20.0, 20.0
        args.workers, args.concurrency = 1, 4
    rate_min = args.rate_min or 1 / args.interval_s
    cfg = Cfg(args.pages, args.domains, rate_min, args.interval_s, args.target,
              args.warmup_s, args.measure_s, args.workers, args.concurrency, args.seed)
    horizon = cfg.warmup_s + cfg.measure_s + 120
    _rates, changes = change_times(cfg.pages, rate_min, horizon, cfg.seed)
    logdir = tempfile.mkdtemp(prefix="zsched-fresh-")
    # The budget: what the fixed interval spends on each domain, as its pacing delay.
    budget_delay_s = round(cfg.interval_s * cfg.domains / cfg.pages, 4)
    rows = [run(cfg, "fixed (same fetches)", cfg.interval_s, changes, logdir, "fixed1"),
            run(cfg, "fixed (2x fetches)", cfg.interval_s / 2, changes, logdir, "fixed2"),
            run(cfg, "allocation", cfg.interval_s, changes, logdir, "alloc", budget_delay_s)]
    if args.with_target:
        rows.append(run(cfg, "adaptive", cfg.interval_s, changes, logdir, "adaptive",
                        budget_delay_s))
    loaded = (f"{cfg.pages:,} pages on {cfg.domains} domains, rates {rate_min:.2g}-"
              f"{rate_min * 1000:.2g}/s, budget {cfg.pages / cfg.interval_s:g} fetches/s "
              f"(each domain paced at {budget_delay_s:g} s), target {cfg.target}, warm-up "
              f"{cfg.warmup_s:g} s, measured {cfg.measure_s:g} s; load average "
              f"{os.getloadavg()[0]:.1f}")
    print(render(rows, loaded))
    if args.json:
        args.json.write_text(json.dumps({
            "config": asdict(cfg), "runs": [asdict(r) for r in rows],
            "budget_delay_s": budget_delay_s,
            "fixed_fetches_at": {r.policy: interpolate_fetches(rows[0], rows[1], r.freshness)
                                 for r in rows[2:]}}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
