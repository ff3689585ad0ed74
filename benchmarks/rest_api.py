#!/usr/bin/env python
"""Benchmark the management REST API (issue 13): request latency, imports, listing walks.

Usage::

    python benchmarks/rest_api.py [--jobs 100000] [--requests 1000] [--concurrent 2000]
        [--django] [--database-url postgres://postgres@127.0.0.1:5432/postgres]
        [--quick] [--json out.json]

What runs:

1. A throwaway ``redis-server`` on a free port (127.0.0.1:6379 is never used) and a
   real ``celery -A gateway:app zsched serve`` process on it (``benchmarks/gateway.py``
   starts it), with a ``write``-scoped token: the Redis store writer.
2. **requests**: over HTTP (one ``httpx.Client``, keep-alive), ``--requests`` jobs
   created one at a time (``POST /v1/jobs``), then each read
   (``GET /v1/jobs/{id}?fires=5``), edited (``PATCH``, one field), run now
   (``POST /v1/jobs/{id}:run``) and deleted (``DELETE``): p50 and p95 per request,
   timed at the client. Then ``--concurrent`` creates from 10 concurrent clients
   (each one request after the other): requests/s.
3. **imports**: ``POST /v1/jobs:import`` of a JSON Lines file of ``--jobs / 10``
   rows, then of ``--jobs`` rows, each file sent twice (the second time every row
   exists: an update). Rows: weekly interval jobs, every 7th a weekday cron job,
   every 10th on one domain and every other one on a host of its own (more hosts
   than the domain cache holds, as in a large scraping fleet), every 100th
   disabled (paused).
4. **walks** of the ``--jobs`` imported jobs: ``GET /v1/jobs?limit=100`` from the
   first page to a null ``next_cursor``, unfiltered, ``domain`` (10 % of the jobs),
   ``kind=cron``, ``status=running`` (matches nothing: a full scan) and
   ``status=paused`` (the paused set). Each walk's ids are checked against the
   rows that match: none missing, none extra.
5. The server's RSS (psutil): after start, after everything, and the peak.

``--django`` runs steps 2 and 3 again through the Django writer (``ModelWriter``):
a second ``zsched serve`` with ``DJANGO_SETTINGS_MODULE=tests.django_settings`` on
a throwaway database (SQLite file by default; with ``--database-url``, a PostgreSQL
database created for the run and dropped after), which must say at startup that it
writes Django models. As a reference point, with no HTTP: django-celery-beat's
``PeriodicTask.objects.create`` per row and its ``bulk_create`` of ``--jobs / 10``
rows (``benchmarks/compare.py``'s loader) on a database of the same kind.

Everything the script starts is stopped at the end, also on error, SIGTERM or
Ctrl-C. Exit status 1 when a check fails (an answer with an unexpected status, an
import that did not create every row, a walk that missed or added a job).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import RedisServer
from compare import TASK, DcbDatabases, Env, Plan, load_dcb, run_child, setup_django
from gateway import RssSampler, Server, make_store, pct, stamped_log

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "{gwbench}:"  # gateway.make_store's: the store this script reads and cleans
TOKEN = "restbench-write-token-0123456789"
WEEK_S = 7 * 86400
HOT_DOMAIN = "hot.example.org"
CRON = "0 7 * * 1-5"
#: Concurrent clients of the create throughput.
CLIENTS = 10
TIMEOUT_S = 600.0
MiB = 1024 * 1024


def _make_app() -> Any:
    from celery import Celery

    return Celery("zsched_rest_bench", broker="memory://", set_as_current=False)


# ---------------------------------------------------------------------- rows
def row(i: int, tag: str) -> dict[str, Any]:
    """Import row ``i`` of a file tagged ``tag``: see the module docstring for the mix."""
    host = HOT_DOMAIN if i % 10 == 0 else f"www{i % 97}.shop{i}.example.net"
    out: dict[str, Any] = {"id": f"{tag}-{i}", "url": f"https://{host}/p/{i}"}
    if i % 7 == 1:
        out.update(cron=CRON, timezone="Europe/Berlin")
    else:
        out["interval_s"] = WEEK_S
    if i % 100 == 3:
        out["enabled"] = False
    return out


def expected(n: int, tag: str) -> dict[str, set[str]]:
    """The ids each walk must list, by walk name."""
    ids = range(n)
    return {
        "unfiltered": {f"{tag}-{i}" for i in ids},
        "domain": {f"{tag}-{i}" for i in ids if i % 10 == 0},
        "kind=cron": {f"{tag}-{i}" for i in ids if i % 7 == 1},
        "status=running": set(),
        "status=paused": {f"{tag}-{i}" for i in ids if i % 100 == 3},
    }


WALKS: dict[str, dict[str, str]] = {
    "unfiltered": {}, "domain": {"domain": HOT_DOMAIN}, "kind=cron": {"kind": "cron"},
    "status=running": {"status": "running"}, "status=paused": {"status": "paused"},
}


def jsonl(n: int, tag: str) -> bytes:
    return "".join(json.dumps(row(i, tag)) + "\n" for i in range(n)).encode()


# ------------------------------------------------------------------ checking
@dataclass
class Checks:
    """Every unexpected answer or count, by what it was; empty when the run is good."""

    failures: list[str] = field(default_factory=list)

    def status(self, what: str, res: httpx.Response, want: int) -> None:
        if res.status_code != want:
            self.failures.append(f"{what}: {res.status_code} (want {want}) {res.text[:200]}")

    def equal(self, what: str, got: Any, want: Any) -> None:
        if got != want:
            self.failures.append(f"{what}: {got!r} (want {want!r})")


def _timed(fn: Callable[..., httpx.Response], *args: Any) -> tuple[float, httpx.Response]:
    started = time.perf_counter()
    res = fn(*args)
    return 1000 * (time.perf_counter() - started), res


def client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"},
                        timeout=TIMEOUT_S)


# ------------------------------------------------------------------- phases
def requests(url: str, n: int, tag: str, checks: Checks) -> dict[str, list[float]]:
    """Create, read, edit, run and delete ``n`` jobs, one request at a time: ms each."""
    ms: dict[str, list[float]] = {op: [] for op in ("create", "get", "patch", "run", "delete")}
    ids = [f"{tag}-{i}" for i in range(n)]
    steps: list[tuple[str, int, Callable[[httpx.Client, str], httpx.Response]]] = [
        ("create", 201, lambda c, i: c.post("/v1/jobs", json=row_for_create(i))),
        ("get", 200, lambda c, i: c.get(f"/v1/jobs/{i}", params={"fires": 5})),
        ("patch", 200, lambda c, i: c.patch(f"/v1/jobs/{i}", json={"queue": "eu"})),
        ("run", 202, lambda c, i: c.post(f"/v1/jobs/{i}:run")),
        ("delete", 204, lambda c, i: c.delete(f"/v1/jobs/{i}")),
    ]
    with client(url) as c:
        c.get("/v1/jobs", params={"limit": 1})  # connect outside the timing
        for op, want, call in steps:
            for job_id in ids:
                took, res = _timed(call, c, job_id)
                ms[op].append(took)
                checks.status(f"{op} {job_id}", res, want)
    return ms


def row_for_create(job_id: str) -> dict[str, Any]:
    return {"id": job_id, "url": f"https://www.{job_id}.example.net/", "interval_s": 3600}


def concurrent_creates(url: str, n: int, tag: str, checks: Checks) -> float:
    """``n`` creates from :data:`CLIENTS` clients, each sequential: requests/s."""
    async def one(k: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT_S,
                                     headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            await c.get("/v1/jobs", params={"limit": 1})
            await ready.wait()
            for i in range(k, n, CLIENTS):
                res = await c.post("/v1/jobs", json=row_for_create(f"{tag}-{i}"))
                checks.status(f"concurrent create {tag}-{i}", res, 201)

    async def go() -> float:
        tasks = [asyncio.create_task(one(k)) for k in range(CLIENTS)]
        await asyncio.sleep(0.5)  # every client connected before the clock starts
        started = time.perf_counter()
        ready.set()
        await asyncio.gather(*tasks)
        return n / (time.perf_counter() - started)

    ready = asyncio.Event()
    return asyncio.run(go())


def import_file(url: str, n: int, tag: str, checks: Checks) -> dict[str, float]:
    """The file of ``n`` rows imported, then imported again: seconds each, at the client."""
    body = jsonl(n, tag)
    out: dict[str, float] = {"rows": n, "mib": len(body) / MiB}
    with client(url) as c:
        for label, created in (("first", n), ("again", 0)):
            took, res = _timed(lambda: c.post("/v1/jobs:import", params={"format": "jsonl"},
                                              content=body))
            checks.status(f"import {n} ({label})", res, 200)
            if res.status_code == 200:
                checks.equal(f"import {n} ({label}) created", res.json()["created"], created)
            out[label] = took / 1000
    return out


def walk(url: str, params: dict[str, str]) -> dict[str, Any]:
    """Every page of ``GET /v1/jobs?limit=100`` with ``params``: time, pages, ids seen."""
    seen: Counter[str] = Counter()
    pages = 0
    cursor: str | None = None
    with client(url) as c:
        c.get("/v1/jobs", params={"limit": 1})
        started = time.perf_counter()
        while True:
            res = c.get("/v1/jobs", params={**params, "limit": 100,
                                            **({"cursor": cursor} if cursor else {})})
            res.raise_for_status()
            page = res.json()
            pages += 1
            seen.update(item["id"] for item in page["items"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "pages": pages, "seen": seen}


def walks(url: str, n: int, tag: str, checks: Checks, log: Callable[[str], None]
          ) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, want in expected(n, tag).items():
        got = walk(url, WALKS[name])
        seen: Counter[str] = got.pop("seen")
        got.update(listed=len(seen), expected=len(want), missing=len(want - set(seen)),
                   extra=len(set(seen) - want), twice=sum(1 for v in seen.values() if v > 1))
        checks.equal(f"walk {name}: missing / extra", (got["missing"], got["extra"]), (0, 0))
        out[name] = got
        log(f"walk {name}: {got['listed']:,} of {len(want):,} in {got['seconds']:.2f}s, "
            f"{got['pages']} pages")
    return out


def delete_all(store: Any, ids: Iterator[str]) -> None:
    """Remove a phase's jobs straight from the store (untimed), so the next starts clean."""
    batch: list[str] = []
    for job_id in ids:
        batch.append(job_id)
        if len(batch) == 1000:
            store.delete(*batch)
            batch = []
    if batch:
        store.delete(*batch)


# ------------------------------------------------------------------ columns
@dataclass
class Column:
    """One writer's run: ``kind`` is ``store`` or ``django``; ``env`` extra server env."""

    kind: str
    title: str
    env: dict[str, str] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)


def run_column(col: Column, redis_url: str, args: argparse.Namespace, logdir: str,
               checks: Checks, log: Callable[[str], None]) -> None:
    """Start a ``zsched serve`` for ``col``, run every phase on it, stop it."""
    store = make_store(redis_url)
    server = Server(redis_url, logdir, events_maxlen=10_000, tokens=f"{TOKEN}:write",
                    env=col.env, name=col.kind)
    sampler: RssSampler | None = None
    res = col.results
    try:
        server.wait_ready(60)
        if col.kind == "django":
            # Without Django models the column would measure the store writer twice.
            line = "REST API writes: Django models"
            checks.equal("django server's writer", line in server.log_path.read_text(), True)
        sampler = RssSampler(server.ps)
        res["rss_started"] = sampler.sample()
        sampler.start()
        log(f"{col.title}: zsched serve on :{server.port} (RSS "
            f"{res['rss_started'] / MiB:.1f} MiB); log {server.log_path}")
        res["requests"] = requests(server.url, args.requests, f"{col.kind}-lat", checks)
        log(f"{col.title}: {args.requests:,} x create/get/patch/run/delete done")
        res["concurrent"] = concurrent_creates(server.url, args.concurrent,
                                               f"{col.kind}-con", checks)
        log(f"{col.title}: {args.concurrent:,} creates by {CLIENTS} clients: "
            f"{res['concurrent']:,.0f} req/s")
        delete_all(store, (f"{col.kind}-con-{i}" for i in range(args.concurrent)))
        for key, n, tag in (("import_small", args.jobs // 10, f"{col.kind}-s"),
                            ("import_big", args.jobs, f"{col.kind}-b")):
            res[key] = import_file(server.url, n, tag, checks)
            log(f"{col.title}: import {n:,} rows {res[key]['first']:.2f}s, again "
                f"{res[key]['again']:.2f}s")
            if key == "import_small":
                delete_all(store, (f"{tag}-{i}" for i in range(n)))
        if col.kind == "store":
            res["walks"] = walks(server.url, args.jobs, f"{col.kind}-b", checks, log)
        sampler.stopped.set()
        res.update(rss_end=sampler.sample(), rss_peak=sampler.peak)
    finally:
        if sampler is not None:
            sampler.stopped.set()
        server.stop()
        store.client.close()


def dcb_creates(env: Env, n: int) -> list[float]:
    """``PeriodicTask.objects.create`` per row (signals and all): ms each."""
    setup_django(env)
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every, _ = IntervalSchedule.objects.get_or_create(every=WEEK_S,
                                                      period=IntervalSchedule.SECONDS)
    ms = []
    for i in range(n):
        started = time.perf_counter()
        PeriodicTask.objects.create(name=f"one-{i}", task=TASK, interval=every,
                                    kwargs=json.dumps({"url": f"https://www.s{i}.example.net/"}))
        ms.append(1000 * (time.perf_counter() - started))
    return ms


def database_url(db: dict[str, Any]) -> str:
    """``db`` (a ``DATABASES`` entry) as the URL ``tests/django_settings.py`` reads."""
    from urllib.parse import quote

    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    return (f"postgres://{quote(db['USER'])}:{quote(db['PASSWORD'])}@{db['HOST']}:"
            f"{db['PORT']}/{quote(db['NAME'])}")


def django_column(dbs: DcbDatabases, args: argparse.Namespace, checks: Checks,
                  log: Callable[[str], None]) -> tuple[Column, dict[str, Any]]:
    """The Django writer's column, on a fresh database, and django-celery-beat's reference."""
    def env_for(db: dict[str, Any]) -> Env:
        return Env(kind="dcb", store_url="", store_port=0, broker_url="", dcb_db=db)

    # compare.py migrates django-celery-beat into a template; the app's own tables
    # (and Django's) are added here, by the settings the server runs with.
    db = dbs.fresh(env_for, "writer")
    env = {"DJANGO_SETTINGS_MODULE": "tests.django_settings", "DATABASE_URL": database_url(db)}
    subprocess.run([sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
                   cwd=ROOT, env={**os.environ, **env}, check=True, timeout=TIMEOUT_S)
    # "PostgreSQL 15.2 (Debian 15.2-1)": the packaging is too long for a column title.
    col = Column("django", f"Django writer, {dbs.version().split(' (')[0]}", env)
    one = dbs.fresh(env_for, "dcbone")
    ms = run_child(TIMEOUT_S, dcb_creates, env_for(one), args.requests)
    checks.equal("django-celery-beat rows created one by one", dbs.count(one), args.requests)
    bulk = dbs.fresh(env_for, "dcbbulk")
    n = args.jobs // 10
    took = run_child(TIMEOUT_S, load_dcb, env_for(bulk), Plan(n, time.time(), 0.0, "bulk"))
    checks.equal("django-celery-beat rows bulk-created", dbs.count(bulk), n)
    log(f"django-celery-beat: create p50 {pct(ms, 0.5):.2f} ms; bulk_create {n:,} "
        f"{took['seconds']:.2f}s")
    return col, {"create_ms": ms, "bulk_rows": n, "bulk_s": took["seconds"]}


# ------------------------------------------------------------------- output
def _ms(values: list[float]) -> str:
    return f"{pct(values, 0.5):.2f} / {pct(values, 0.95):.2f}"


def _rate(seconds: float, rows: int) -> str:
    return f"{seconds:.2f} s ({rows / seconds:,.0f} rows/s)"


def _request_rows(args: argparse.Namespace) -> list[tuple[str, Callable[[dict[str, Any]], str]]]:
    def lat(op: str) -> Callable[[dict[str, Any]], str]:
        return lambda r: _ms(r["requests"][op])

    def imp(key: str, label: str) -> Callable[[dict[str, Any]], str]:
        return lambda r: _rate(r[key][label], int(r[key]["rows"]))

    small, big = args.jobs // 10, args.jobs
    return [
        (f"POST /v1/jobs (create), p50 / p95 ms, {args.requests:,} requests", lat("create")),
        ("GET /v1/jobs/{id}?fires=5, p50 / p95 ms", lat("get")),
        ("PATCH /v1/jobs/{id} (one field), p50 / p95 ms", lat("patch")),
        ("POST /v1/jobs/{id}:run, p50 / p95 ms", lat("run")),
        ("DELETE /v1/jobs/{id}, p50 / p95 ms", lat("delete")),
        (f"POST /v1/jobs, {CLIENTS} concurrent clients ({args.concurrent:,} creates), req/s",
         lambda r: f"{r['concurrent']:,.0f}"),
        (f"POST /v1/jobs:import, {small:,} JSONL rows", imp("import_small", "first")),
        (f"the same {small:,} rows again (every row exists)", imp("import_small", "again")),
        (f"POST /v1/jobs:import, {big:,} JSONL rows", imp("import_big", "first")),
        (f"the same {big:,} rows again (every row exists)", imp("import_big", "again")),
        ("server RSS: started / peak / end, MiB",
         lambda r: f"{r['rss_started'] / MiB:.1f} / {r['rss_peak'] / MiB:.1f} / "
                   f"{r['rss_end'] / MiB:.1f}"),
    ]


def _walk_label(name: str, walk: dict[str, Any], n: int) -> str:
    share = f", {100 * walk['expected'] / n:.0f} % of the jobs" if walk["expected"] else ""
    what = {"domain": f"domain={HOT_DOMAIN}",
            "status=running": "status=running (matches nothing: a full scan)",
            "status=paused": "status=paused (the paused set)"}.get(name, name)
    return f"GET /v1/jobs walk, {what}{share}: s / pages / ms per page"


def render(cols: list[Column], dcb: dict[str, Any] | None, args: argparse.Namespace) -> str:
    lines = ["| measure | " + " | ".join(c.title for c in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for label, cell in _request_rows(args):
        lines.append(f"| {label} | " + " | ".join(cell(c.results) for c in cols) + " |")
    store = cols[0].results
    for name, w in store["walks"].items():
        value = (f"{w['seconds']:.2f} / {w['pages']:,} / {1000 * w['seconds'] / w['pages']:.1f}"
                 f" ({w['listed']:,} listed)")
        lines.append(f"| {_walk_label(name, w, args.jobs)} | {value} |"
                     + " - |" * (len(cols) - 1))
    if dcb is not None:
        lines.append("| django-celery-beat: PeriodicTask.objects.create (ORM, no HTTP), "
                     f"p50 / p95 ms | - | {_ms(dcb['create_ms'])} |")
        lines.append(f"| django-celery-beat: bulk_create of {dcb['bulk_rows']:,} rows (ORM, "
                     f"no HTTP) | - | {_rate(dcb['bulk_s'], dcb['bulk_rows'])} |")
    return "\n".join(lines)


# --------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int,
                        help="rows of the large import and jobs walked (default 100,000; "
                             "the small import is a tenth)")
    parser.add_argument("--requests", type=int,
                        help="jobs created, read, edited, run and deleted one request at a "
                             "time (default 1,000)")
    parser.add_argument("--concurrent", type=int,
                        help=f"creates by {CLIENTS} concurrent clients (default 2,000)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (3,000 jobs, 50 requests, 200 concurrent creates) "
                             "unless given")
    parser.add_argument("--django", action="store_true",
                        help="also run requests and imports through the Django writer, and "
                             "django-celery-beat's ORM as a reference")
    parser.add_argument("--database-url",
                        help="with --django: PostgreSQL to create the throwaway databases on, "
                             "e.g. postgres://postgres@127.0.0.1:5432/postgres (default: "
                             "SQLite files)")
    parser.add_argument("--json", help="also write raw results to this file")
    args = parser.parse_args(argv)
    for name, full, quick in (("jobs", 100_000, 3_000), ("requests", 1_000, 50),
                              ("concurrent", 2_000, 200)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.jobs < 100 or args.requests < 1 or args.concurrent < 1:
        parser.error("--jobs must be at least 100, --requests and --concurrent at least 1")
    if args.database_url and not args.django:
        parser.error("--database-url needs --django")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    log = stamped_log(started)
    # Turn SIGTERM into an exception so the finally blocks stop every process.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logdir = tempfile.mkdtemp(prefix="zsched-rest-bench-")
    checks = Checks()
    cols = [Column("store", "Redis store writer")]
    dcb: dict[str, Any] | None = None
    redis_server = RedisServer("rest")
    dbs = DcbDatabases("postgres" if args.database_url else "sqlite", args.database_url or "")
    try:
        redis_server.start()
        run_column(cols[0], redis_server.url(), args, logdir, checks, log)
        if args.django:
            col, dcb = django_column(dbs, args, checks, log)
            cols.append(col)
            run_column(col, redis_server.url(), args, logdir, checks, log)
    finally:
        redis_server.stop()
        dbs.close()
    print(render(cols, dcb, args))
    print(f"\n(total {time.monotonic() - started:.0f}s; python {sys.version.split()[0]}, "
          f"{psutil.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.2f}; logs {logdir})")
    for failure in checks.failures[:20]:
        print(f"CHECK FAILED: {failure}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "ok": not checks.failures,
                       "failures": checks.failures, "dcb": dcb,
                       "columns": {c.kind: c.results for c in cols}}, fh, indent=2, default=str)
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
