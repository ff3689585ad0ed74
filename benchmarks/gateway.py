#!/usr/bin/env python
"""Benchmark the HTTP job gateway (issue 13): throughput, wake-up latency, server RSS.

Usage::

    python benchmarks/gateway.py [--jobs 100000] [--clients 100] [--wake-jobs 200]
        [--wake-spread-s 4] [--batch N] [--loop asyncio|uvloop] [--http h11|httptools]
        [--compare] [--json out.json]

What runs:

1. A throwaway ``redis-server`` on a free port (127.0.0.1:6379 is never used) and
   a real ``celery -A gateway:app zsched serve`` process on it (this file is the
   Celery app; a ``worker``-scoped token), started and waited for until it answers.
2. **drain**: ``--jobs`` HTTP-transport jobs (interval one week, no jitter), all
   due now, loaded through the store's bulk path (``Store.upsert_many`` with
   ``stagger=False``). Then ``--clients`` concurrent long-polling clients
   (asyncio, one ``httpx.AsyncClient`` and keep-alive connection each) loop
   ``GET /jobs/next`` -> ``POST /jobs/{id}/complete`` (the lease echoed) until every
   job is settled; with ``--batch N``, ``GET /jobs/next?max=N`` -> one
   ``POST /jobs/report`` for the jobs it got. Reported: end-to-end jobs/s from
   the clients' start to the last applied report, the server's (and Redis') CPU
   per job, and a check read back from Redis: every job settled exactly once in
   the settle stream, the store's ``promoted`` and ``complete`` counters, and no
   job handed out twice.
3. **wake**: with the clients idle in long polls, ``--wake-jobs`` one-shot jobs
   are upserted to fall due at known times spread over ``--wake-spread-s``; each
   one's wake-up is the client's answer time minus the job's due time
   (``scheduled_at``; Redis' clock and this host's are the same machine's). The
   wake phase always polls for one job (no ``max``): it measures the single poll.
4. The server process's RSS (psutil), sampled every 100 ms: after start, peak, end.

The table ends with the reference point of the Go service celery-zsched's gateway
descends from: by default it promotes 100 jobs per 5 s poll, a ceiling of 20 jobs/s
per poller.

``--compare`` runs the whole benchmark four times, each on a fresh redis-server
and server: one job per request or ``--batch`` (default 100 with ``--compare``)
jobs per request, each on asyncio with h11 (uvicorn's plain loop and parser) and
on uvloop with httptools, and prints one table of the four.

Everything the script starts is stopped at the end, also on error, SIGTERM or
Ctrl-C. Exit status 1 when the check fails (a job settled twice or never, a
duplicate hand-out, a wake job never delivered); otherwise nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import RedisServer, _free_port

HERE = Path(__file__).resolve().parent
PREFIX = "{gwbench}:"
TOKEN = "gwbench-worker-token-0123456789"
WEEK_S = 7 * 86400.0
#: The long-poll timeout the clients ask for (the server's cap is zsched_gateway_timeout_s).
POLL_TIMEOUT_S = 5.0
#: The Go service's defaults, the reference point: jobs promoted per poll, poll period.
GO_BATCH, GO_POLL_S = 100, 5.0
STOP_GRACE_S = 15.0


def _make_app() -> Any:
    """The Celery app of ``zsched serve``: settings come from ``ZSCHED_*``; no broker needed."""
    from celery import Celery

    return Celery("zsched_gateway_bench", broker="memory://", set_as_current=False)


_APP: Any = None


def __getattr__(name: str) -> Any:
    """``gateway.app``, built on first use (PEP 562): only the server process needs it."""
    global _APP
    if name == "app":
        if _APP is None:
            _APP = _make_app()
        return _APP
    raise AttributeError(name)


# ------------------------------------------------------------------ server
class Server:
    """``celery -A gateway:app zsched serve`` in a process (and session) of its own.

    ``prefix`` and ``tokens`` (``token:scope`` pairs) are the server's
    ``ZSCHED_*`` settings; ``env`` adds variables (``DJANGO_SETTINGS_MODULE`` and
    the like: the caller's own ``ZSCHED_``, ``CELERY_`` and ``DJANGO_`` ones are
    dropped); ``name`` names the log file.
    """

    def __init__(self, redis_url: str, logdir: str, events_maxlen: int, *,
                 prefix: str = PREFIX, tokens: str = f"{TOKEN}:worker",
                 env: dict[str, str] | None = None, name: str = "serve",
                 loop: str = "auto", http: str = "auto") -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        keep = {k: v for k, v in os.environ.items()
                if not k.startswith(("ZSCHED_", "CELERY_", "DJANGO_"))}
        paths = [str(HERE), str(HERE.parent), keep.get("PYTHONPATH", "")]
        env = {**keep, "PYTHONPATH": os.pathsep.join(paths),
               "ZSCHED_REDIS_URL": redis_url, "ZSCHED_KEY_PREFIX": prefix,
               "ZSCHED_API_TOKENS": tokens, "ZSCHED_MAX_JITTER_S": "0",
               # Any 32+ characters: every server of one benchmark signs leases alike.
               "ZSCHED_GATEWAY_LEASE_SECRET": "benchmark-lease-secret-0123456789abcdef",
               "ZSCHED_EVENTS_MAXLEN": str(events_maxlen), **(env or {})}
        self.log_path = Path(logdir) / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "gateway:app", "zsched", "serve",
                 "--port", str(self.port), "--log-level", "warning", "--loop", loop,
                 "--http", http],
                cwd=str(HERE), env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        self.ps = psutil.Process(self.proc.pid)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"zsched serve exited:\n{self.log_path.read_text()}")
            try:
                httpx.get(f"{self.url}/jobs/next", timeout=1)  # 401 without a token: it answers
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise TimeoutError("zsched serve did not answer")

    def cpu_s(self) -> float:
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


class RssSampler(threading.Thread):
    """The RSS of one process every ``every_s``: the peak and the last sample."""

    def __init__(self, proc: Any, every_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.proc = proc
        self.every_s = every_s
        self.peak = 0
        self.last = 0
        self.stopped = threading.Event()

    def sample(self) -> int:
        try:
            rss = int(self.proc.memory_info().rss)
        except psutil.Error:
            return self.last
        self.peak = max(self.peak, rss)
        self.last = rss
        return rss

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            self.sample()


# ------------------------------------------------------------------- store
def make_store(redis_url: str) -> Any:
    from celery_zsched.config import Settings
    from celery_zsched.store import Store

    return Store.from_settings(Settings(redis_url=redis_url, key_prefix=PREFIX,
                                        max_jitter_s=0.0))


def load_due(store: Any, n: int) -> float:
    """``n`` HTTP jobs due now through the bulk path; the seconds it took."""
    from celery_zsched.core.job import Job

    started = time.perf_counter()
    jobs = [Job.from_dict({"id": f"g{i}", "url": f"http://target.invalid/g{i}",
                           "transport": "http", "interval_s": WEEK_S, "jitter_s": 0}, row=i)
            for i in range(n)]
    store.upsert_many(jobs, stagger=False, total=n)
    return time.perf_counter() - started


def settle_check(store: Any, ids: set[str]) -> dict[str, int]:
    """Read every settle event back: how many of ``ids`` settled once, twice or more, never."""
    seen: Counter[str] = Counter()
    after = "0"
    while True:
        rows = store.events(after, count=10_000)
        if not rows:
            break
        for _, fields in rows:
            if fields.get("id") in ids and fields.get("status") == "complete":
                seen[fields["id"]] += 1
        after = rows[-1][0]
    return {"settled_once": sum(1 for c in seen.values() if c == 1),
            "settled_twice_or_more": sum(1 for c in seen.values() if c > 1),
            "never_settled": len(ids - set(seen))}


# ----------------------------------------------------------------- clients
@dataclass
class Tally:
    """What the clients saw in one phase."""

    target: int
    done: int = 0
    handed: Counter[str] = field(default_factory=Counter)
    polls: int = 0
    empty_polls: int = 0
    stale: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    #: Per job: (answer time on this host's wall clock, ms; scheduled_at, ms).
    answered: dict[str, tuple[float, int]] = field(default_factory=dict)
    last_done: float = 0.0
    finished: asyncio.Event = field(default_factory=asyncio.Event)


class RawConn:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams (GET and POST, JSON).

    It costs a fraction of httpx's CPU per request, so on a small machine the
    clients leave the cores to the server being measured. Enough for uvicorn's
    answers: a status line, headers, a ``Content-Length`` body (none for 204).
    """

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.auth = f"Authorization: Bearer {TOKEN}\r\n".encode()

    async def request(self, method: str, path: str,
                      body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n").encode()
        head += self.auth
        if method == "POST":
            head += (f"Content-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n").encode()
        self.writer.write(head + b"\r\n" + body)
        try:
            raw = await self.reader.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            data = await self.reader.readexactly(length) if length else b""
        except BaseException:
            await self.close()
            raise
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, headers, data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None


class HttpxConn:
    """The same requests through ``httpx.AsyncClient`` (``--client httpx``)."""

    def __init__(self, url: str) -> None:
        self.client = httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=httpx.Timeout(POLL_TIMEOUT_S + 10),
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))

    async def request(self, method: str, path: str,
                      body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        headers = {"Content-Type": "application/json"} if method == "POST" else {}
        res = await self.client.request(method, path, content=body or None, headers=headers)
        return res.status_code, dict(res.headers), res.content

    async def close(self) -> None:
        await self.client.aclose()


async def client_loop(url: str, tally: Tally, kind: str, batch: int = 1) -> None:
    """One worker: long-poll, complete, repeat until the phase's jobs are all settled.

    ``batch`` > 1: poll for up to that many jobs (``?max=``) and report them in one
    ``POST /jobs/report``.
    """
    conn: RawConn | HttpxConn = RawConn(url) if kind == "raw" else HttpxConn(url)
    poll = f"/jobs/next?timeout={POLL_TIMEOUT_S:g}" + (f"&max={batch}" if batch > 1 else "")
    try:
        while not tally.finished.is_set():
            try:
                status, headers, body = await conn.request("GET", poll)
            except (OSError, asyncio.IncompleteReadError, httpx.HTTPError) as exc:
                tally.errors[f"GET {type(exc).__name__}"] += 1
                await asyncio.sleep(0.1)
                continue
            answered_ms = time.time() * 1000
            tally.polls += 1
            if status == 204:
                tally.empty_polls += 1
                continue
            if status != 200:
                tally.errors[f"GET {status}"] += 1
                await asyncio.sleep(float(headers.get("retry-after", "0.5")))
                continue
            answer = json.loads(body)
            jobs = answer["jobs"] if batch > 1 else [answer]
            for job in jobs:
                tally.handed[job["id"]] += 1
                tally.answered.setdefault(job["id"], (answered_ms, int(job["scheduled_at"])))
            try:
                codes = await _report(conn, jobs, batch > 1)
            except (OSError, asyncio.IncompleteReadError, httpx.HTTPError) as exc:
                tally.errors[f"POST {type(exc).__name__}"] += 1
                continue
            for code in codes:
                if code == 200:
                    tally.done += 1
                elif code == 409:
                    tally.stale += 1
                else:
                    tally.errors[f"POST {code}"] += 1
            if codes.count(200):
                tally.last_done = time.perf_counter()
                if tally.done >= tally.target:
                    tally.finished.set()
    finally:
        await conn.close()


async def _report(conn: RawConn | HttpxConn, jobs: list[dict[str, Any]], batched: bool
                  ) -> list[int]:
    """Complete ``jobs``: one report each, or one batch report; each one's status."""
    echo = ("lease", "scheduled_at", "picked_up_at")
    if batched:
        reports = [{"id": job["id"], "outcome": "complete", **{k: job[k] for k in echo}}
                   for job in jobs]
        status, _, body = await conn.request("POST", "/jobs/report",
                                             json.dumps({"reports": reports}).encode())
        if status != 200:
            return [status] * len(jobs)
        return [int(item["code"]) for item in json.loads(body)["results"]]
    job = jobs[0]
    report = json.dumps({k: job[k] for k in echo})
    status, _, body = await conn.request("POST", f"/jobs/{job['id']}/complete",
                                         report.encode())
    return [200 if status == 200 and json.loads(body).get("applied") else status]


async def run_clients(url: str, clients: int, tally: Tally, deadline_s: float, kind: str,
                      before: Any = None, batch: int = 1) -> float:
    """Run the clients until ``tally`` is finished or ``deadline_s`` passed; the start time.

    ``before``: an async callable run once the clients are started (the wake phase
    schedules its jobs there).
    """
    started = time.perf_counter()
    tasks = [asyncio.create_task(client_loop(url, tally, kind, batch))
             for _ in range(clients)]
    try:
        if before is not None:
            await before()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(tally.finished.wait(), deadline_s)
    finally:
        tally.finished.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return started


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


# ------------------------------------------------------------------- phases
def drain(server: Server, store: Any, redis_ps: Any, args: argparse.Namespace,
          log: Any) -> dict[str, Any]:
    seconds = load_due(store, args.jobs)
    log(f"loaded {args.jobs:,} due HTTP jobs in {seconds:.1f}s; draining with "
        f"{args.clients} clients")
    cpu0, redis_cpu0 = server.cpu_s(), _cpu(redis_ps)
    own0 = time.process_time()

    async def go() -> tuple[Tally, float]:
        tally = Tally(target=args.jobs)
        started = await run_clients(server.url, args.clients, tally, args.timeout_s,
                                    args.client, batch=args.batch)
        return tally, started

    tally, started = asyncio.run(go())
    elapsed = (tally.last_done or time.perf_counter()) - started
    server_cpu = server.cpu_s() - cpu0
    redis_cpu = _cpu(redis_ps) - redis_cpu0
    own_cpu = time.process_time() - own0
    ids = {f"g{i}" for i in range(args.jobs)}
    check = settle_check(store, ids)
    stats = store.stats()
    handed_twice = sum(1 for c in tally.handed.values() if c > 1)
    out = {
        "jobs": args.jobs, "clients": args.clients, "client": args.client, "load_s": seconds,
        "batch": args.batch, "loop": args.loop, "http": args.http,
        "done": tally.done, "seconds": elapsed, "jobs_per_s": tally.done / elapsed,
        "server_cpu_ms_per_job": 1000 * server_cpu / max(tally.done, 1),
        "redis_cpu_ms_per_job": 1000 * redis_cpu / max(tally.done, 1),
        "clients_cpu_ms_per_job": 1000 * own_cpu / max(tally.done, 1),
        "polls": tally.polls, "empty_polls": tally.empty_polls, "stale_reports": tally.stale,
        "errors": dict(tally.errors), "handed_out_twice": handed_twice,
        "never_handed_out": len(ids - set(tally.handed)),
        "counter_promoted": stats.get("total_promoted", 0),
        "counter_complete": stats.get("total_complete", 0),
        # Leases that ran out unreported and came back (each one is handed out again).
        "counter_redelivered": stats.get("total_redelivered", 0),
        **check,
    }
    # promoted counts claims: a job claimed for a poll that timed out meanwhile is
    # released unchanged and claimed again, so it may pass the jobs, never fall short.
    out["ok"] = (check["settled_once"] == args.jobs and check["settled_twice_or_more"] == 0
                 and handed_twice == 0 and out["counter_complete"] == args.jobs
                 and out["counter_promoted"] >= args.jobs)
    log(f"drain: {tally.done:,} in {elapsed:.1f}s = {out['jobs_per_s']:,.0f} jobs/s; "
        f"check {'OK' if out['ok'] else 'FAILED'} {check}")
    return out


def wake(server: Server, store: Any, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    from celery_zsched.core.job import Job

    planned: dict[str, int] = {}

    async def schedule() -> None:
        # Let every client get in line first, so the polls wait idle when jobs fall due.
        await asyncio.sleep(args.wake_lead_s)
        first = store.now_ms() + 1000
        step = args.wake_spread_s * 1000 / max(args.wake_jobs - 1, 1)
        jobs = []
        for i in range(args.wake_jobs):
            due = first + round(i * step)
            planned[f"w{i}"] = due
            jobs.append(Job.from_dict({"id": f"w{i}", "url": f"http://target.invalid/w{i}",
                                       "transport": "http", "run_at": due / 1000,
                                       "jitter_s": 0}, row=i))
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: store.upsert_many(jobs, stagger=False, total=len(jobs)))

    async def go() -> Tally:
        tally = Tally(target=args.wake_jobs)
        deadline = args.wake_lead_s + args.wake_spread_s + 30
        await run_clients(server.url, args.clients, tally, deadline, args.client,
                          before=schedule)
        return tally

    tally = asyncio.run(go())
    late = [answered - due for answered, due in tally.answered.values()]
    moved = sum(1 for i, (_, due) in tally.answered.items() if planned.get(i) != due)
    handed_twice = sum(1 for c in tally.handed.values() if c > 1)
    out: dict[str, Any] = {"wake_jobs": args.wake_jobs, "spread_s": args.wake_spread_s,
                           "delivered": len(tally.answered), "completed": tally.done,
                           "handed_out_twice": handed_twice, "due_time_moved": moved,
                           "errors": dict(tally.errors)}
    if late:
        out.update({"p50_ms": pct(late, 0.5), "p90_ms": pct(late, 0.9),
                    "p99_ms": pct(late, 0.99), "max_ms": max(late), "min_ms": min(late),
                    "mean_ms": statistics.fmean(late)})
    out["ok"] = (len(tally.answered) == args.wake_jobs and tally.done == args.wake_jobs
                 and handed_twice == 0)
    log(f"wake: {len(late)} of {args.wake_jobs} delivered; p50 {out.get('p50_ms', 0):.1f} ms "
        f"p99 {out.get('p99_ms', 0):.1f} ms max {out.get('max_ms', 0):.1f} ms")
    return out


def _cpu(ps: Any) -> float:
    times = ps.cpu_times()
    return float(times.user + times.system)


# ------------------------------------------------------------------- output
def render(res: dict[str, Any]) -> str:
    d, w, m = res["drain"], res["wake"], res["rss"]
    mode = f"batches of {d['batch']}" if d["batch"] > 1 else "one job per request"
    mib = 1024 * 1024
    go_ceiling = GO_BATCH / GO_POLL_S
    rows = [
        ("jobs drained (all due at once) / long-polling clients",
         f"{d['jobs']:,} / {d['clients']} ({d['client']})"),
        ("requests / server loop / parser", f"{mode} / {d['loop']} / {d['http']}"),
        ("end to end: poll + complete + settle, jobs/s",
         f"**{d['jobs_per_s']:,.0f}** ({d['done']:,} in {d['seconds']:.1f} s)"),
        ("settled exactly once / duplicates / missing",
         f"{d['settled_once']:,} / {d['settled_twice_or_more'] + d['handed_out_twice']} / "
         f"{d['never_settled']}"),
        ("stale reports (409) / errors", f"{d['stale_reports']} / {sum(d['errors'].values())}"),
        ("CPU per job: server / Redis / the clients",
         f"{d['server_cpu_ms_per_job']:.2f} / {d['redis_cpu_ms_per_job']:.2f} / "
         f"{d['clients_cpu_ms_per_job']:.2f} ms"),
    ]
    if "p50_ms" in w:
        rows.append((f"wake-up, job due -> answer ({w['wake_jobs']} jobs over "
                     f"{w['spread_s']:g} s, {d['clients']} idle polls) p50 / p90 / p99 / max",
                     f"**{w['p50_ms']:.1f}** / {w['p90_ms']:.1f} / **{w['p99_ms']:.1f}** / "
                     f"{w['max_ms']:.1f} ms"))
    rows.append(("wake jobs delivered / handed out twice",
                 f"{w['delivered']} of {w['wake_jobs']} / {w['handed_out_twice']}"))
    rows.append(("server RSS: started / peak / end",
                 f"{m['started'] / mib:.1f} / {m['peak'] / mib:.1f} / {m['end'] / mib:.1f} MiB"))
    rows.append((f"reference: the Go service, {GO_BATCH} jobs per {GO_POLL_S:g} s poll (default)",
                 f"{go_ceiling:g} jobs/s promotion ceiling per poller"))
    lines = ["| measure | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=100_000,
                        help="drain: due HTTP jobs (default 100,000)")
    parser.add_argument("--clients", type=int, default=100,
                        help="concurrent long-polling clients (default 100)")
    parser.add_argument("--wake-jobs", type=int, default=200,
                        help="wake: jobs falling due at known times (default 200)")
    parser.add_argument("--wake-spread-s", type=float, default=4.0,
                        help="wake: seconds the due times are spread over (default 4)")
    parser.add_argument("--wake-lead-s", type=float, default=1.0,
                        help="wake: seconds the clients poll idle before the jobs are "
                             "scheduled (default 1)")
    parser.add_argument("--timeout-s", type=float, default=1800.0,
                        help="drain: give up after this many seconds (default 1800)")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="HTTP client of the workers: raw asyncio streams, cheap on "
                             "CPU (default), or httpx.AsyncClient")
    parser.add_argument("--batch", type=int, default=1,
                        help="drain: jobs per poll (?max=) and reports per POST /jobs/report; "
                             "1 (default): one job per poll, reported alone")
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto",
                        help="the server's event loop (zsched serve --loop)")
    parser.add_argument("--http", choices=("auto", "h11", "httptools"), default="auto",
                        help="the server's HTTP parser (zsched serve --http)")
    parser.add_argument("--compare", action="store_true",
                        help="run four times: one job per request and --batch (default "
                             "100), each on asyncio/h11 and uvloop/httptools; one table")
    parser.add_argument("--json", help="also write raw results to this file")
    return parser.parse_args(argv)


def stamped_log(started: float) -> Callable[[str], None]:
    """A log to stderr, each line stamped with the seconds since ``started`` (monotonic)."""
    def log(msg: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {msg}", file=sys.stderr, flush=True)

    return log


def run_one(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    """The benchmark once, on a fresh redis-server and server of ``args``' loop and parser."""
    logdir = tempfile.mkdtemp(prefix="zsched-gateway-bench-")
    redis_server = RedisServer("gateway")
    server: Server | None = None
    sampler: RssSampler | None = None
    results: dict[str, Any] = {"args": vars(args)}
    try:
        redis_server.start()
        assert redis_server.proc is not None
        redis_ps = psutil.Process(redis_server.proc.pid)
        store = make_store(redis_server.url())
        server = Server(redis_server.url(), logdir,
                        events_maxlen=2 * (args.jobs + args.wake_jobs) + 1000,
                        loop=args.loop, http=args.http)
        server.wait_ready()
        sampler = RssSampler(server.ps)
        rss_started = sampler.sample()
        sampler.start()
        log(f"redis on :{redis_server.port}, zsched serve on :{server.port} ({args.loop} "
            f"loop, {args.http} parser, batch {args.batch}; RSS {rss_started / 2**20:.1f} "
            f"MiB); log {server.log_path}")
        results["drain"] = drain(server, store, redis_ps, args, log)
        results["wake"] = wake(server, store, args, log)
        sampler.stopped.set()
        results["rss"] = {"started": rss_started, "peak": sampler.peak, "end": sampler.sample()}
        results["log"] = str(server.log_path)
    finally:
        if sampler is not None:
            sampler.stopped.set()
        if server is not None:
            server.stop()
        redis_server.stop()
    results["ok"] = results["drain"]["ok"] and results["wake"]["ok"]
    return results


#: --compare: (batch or not, loop, parser), the first today's configuration.
CONFIGS = [(False, "asyncio", "h11"), (False, "uvloop", "httptools"),
           (True, "asyncio", "h11"), (True, "uvloop", "httptools")]


def render_compare(runs: list[dict[str, Any]]) -> str:
    """One row per configuration: jobs/s, CPU per job, exactly-once, single-poll wake-up."""
    lines = ["| requests | loop / parser | jobs/s end to end | server CPU per job | "
             "settled once / dup / missing | wake-up p50 / p99 / max (single poll) |",
             "|---|---|---|---|---|---|"]
    for run in runs:
        d, w = run["drain"], run["wake"]
        mode = f"batch of {d['batch']}" if d["batch"] > 1 else "one job each"
        wake_ms = (f"{w['p50_ms']:.1f} / {w['p99_ms']:.1f} / {w['max_ms']:.1f} ms"
                   if "p50_ms" in w else "-")
        lines.append(
            f"| {mode} | {d['loop']} / {d['http']} | **{d['jobs_per_s']:,.0f}** | "
            f"{d['server_cpu_ms_per_job']:.3f} ms | {d['settled_once']:,} / "
            f"{d['settled_twice_or_more'] + d['handed_out_twice']} / {d['never_settled']} | "
            f"{wake_ms} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    log = stamped_log(started)
    # Turn SIGTERM into an exception so the finally block stops every process.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.compare:
        batch = args.batch if args.batch > 1 else 100
        runs = [run_one(argparse.Namespace(**{**vars(args), "batch": batch if batched else 1,
                                              "loop": loop, "http": http}), log)
                for batched, loop, http in CONFIGS]
        print(render_compare(runs))
        out: dict[str, Any] = {"runs": runs, "ok": all(run["ok"] for run in runs)}
    else:
        out = run_one(args, log)
        print(render(out))
    print(f"\n(total {time.monotonic() - started:.0f}s; python {sys.version.split()[0]}, "
          f"{psutil.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.2f})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2, default=str)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

