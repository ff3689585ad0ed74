#!/usr/bin/env python
"""Benchmark the admin dashboard (issue 12): render time at 1,000,000 jobs and 100,000 runs.

Usage::

    python benchmarks/dashboard.py [--jobs 1000000] [--runs 100000] [--renders 30]
        [--db sqlite|postgres] [--partitions 1] [--spread-hours 24] [--json out.json]

What runs:

1. A throwaway ``redis-server`` (no persistence, free port; 127.0.0.1:6379 is
   never touched) gets ``--jobs`` interval jobs through the store's bulk path
   (:meth:`Store.upsert_many`, pipelined, with explicit first due times spread
   over the next 48 hours, 1% of them overdue), a few paused and dead-lettered.
2. The database gets ``--runs`` :class:`ZSchedRun` rows, finished within the
   last ``--spread-hours`` (24 by default: the whole table sits in the
   dashboard's window, the worst case), with log-normal lateness and mixed
   outcomes. ``--db sqlite`` uses a
   file in a temporary directory; ``--db postgres`` creates a throwaway database
   on the local PostgreSQL (``--pg-dsn``), and drops it at the end.
3. The dashboard is rendered ``--renders`` times through Django's test client,
   logged in as a superuser, after one warm-up render. Each render is timed
   (wall clock, whole request), and Redis commands (``INFO commandstats``
   deltas) and SQL queries are counted. Then each data source is timed on its own.

Prints a markdown table. A script, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import RedisServer, command_calls

#: Filled once Django is set up (this module is the ROOT_URLCONF).
urlpatterns: list[Any] = []
TARGET_MS = 300
HOUR_MS = 3_600_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--renders", type=int, default=30)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--spread-hours", type=int, default=24,
                        help="runs finish within this many hours (24: all in the window)")
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--pg-dsn", default="host=127.0.0.1 port=5432 user=postgres",
                        help="libpq DSN of a role that may create databases (--db postgres)")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    for name in ("jobs", "runs", "renders", "partitions", "spread_hours"):
        if getattr(args, name) < (0 if name in ("jobs", "runs") else 1):
            parser.error(f"--{name.replace('_', '-')} must be positive")
    return args


# ------------------------------------------------------------------ databases
@contextlib.contextmanager
def database(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """Django's DATABASES entry of a throwaway database, removed afterwards."""
    if args.db == "sqlite":
        with tempfile.TemporaryDirectory(prefix="zsched-dash-") as tmp:
            yield {"ENGINE": "django.db.backends.sqlite3", "NAME": str(Path(tmp) / "db.sqlite3")}
        return
    import psycopg

    name = f"zsched_dash_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    params = dict(item.split("=", 1) for item in args.pg_dsn.split())
    try:
        yield {"ENGINE": "django.db.backends.postgresql", "NAME": name,
               "HOST": params.get("host", ""), "PORT": params.get("port", ""),
               "USER": params.get("user", ""), "PASSWORD": params.get("password", "")}
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(args.pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def setup_django(db: dict[str, Any], redis_url: str, partitions: int) -> None:
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False, SECRET_KEY="bench", ROOT_URLCONF=__name__, USE_TZ=True, TIME_ZONE="UTC",
        ALLOWED_HOSTS=["testserver"], DATABASES={"default": db},
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth",
                        "django.contrib.sessions", "django.contrib.messages",
                        "celery_zsched.contrib.django", "django.contrib.admin"],
        MIDDLEWARE=["django.contrib.sessions.middleware.SessionMiddleware",
                    "django.middleware.common.CommonMiddleware",
                    "django.middleware.csrf.CsrfViewMiddleware",
                    "django.contrib.auth.middleware.AuthenticationMiddleware",
                    "django.contrib.messages.middleware.MessageMiddleware"],
        TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates",
                    "APP_DIRS": True, "OPTIONS": {"context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages"]}}],
        CELERY_ZSCHED_REDIS_URL=redis_url, CELERY_ZSCHED_PARTITIONS=partitions,
        CELERY_ZSCHED_MAX_JITTER_S=0,
        LOGGING_CONFIG=None,
    )
    django.setup()
    from django.contrib import admin
    from django.urls import path

    urlpatterns.append(path("admin/", admin.site.urls))


# --------------------------------------------------------------------- loading
def load_jobs(store: Any, count: int, seed: int = 1) -> float:
    """``count`` jobs through ``upsert_many`` (first due times given); seconds taken."""
    from celery_zsched.core.job import Job

    started = time.perf_counter()
    rng = random.Random(seed)
    now = store.now_ms()
    template = Job.from_dict({"id": "template", "task": "scrape", "interval_s": 86400,
                              "url": "https://example.test/page", "jitter_s": 0})
    chunk = 50_000
    for first in range(0, count, chunk):
        ids = [f"j{i:07d}" for i in range(first, min(first + chunk, count))]
        jobs = [dataclasses.replace(template, id=i, url=f"https://example.test/{i}")
                for i in ids]
        # 1% overdue, the rest over the next 48 hours.
        due = {i: now + (rng.randrange(-HOUR_MS, 0) if rng.random() < 0.01
                         else rng.randrange(0, 48 * HOUR_MS)) for i in ids}
        store.upsert_many(jobs, first_due=due, stagger=False)
    store.pause(*(f"j{i:07d}" for i in range(0, count, max(count // 500, 1))))
    return time.perf_counter() - started


def load_runs(count: int, hours: int = 24, seed: int = 2) -> float:
    """``count`` run rows finished within the last ``hours``; seconds taken."""
    from django.utils import timezone

    from celery_zsched.contrib.django.models import ZSchedRun

    started = time.perf_counter()
    rng = random.Random(seed)
    now = timezone.now()
    statuses = ["complete"] * 90 + ["retrying"] * 5 + ["error"] * 4 + ["skipped"]
    batch: list[ZSchedRun] = []
    for n in range(count):
        finished = now - timedelta(milliseconds=rng.randrange(0, hours * HOUR_MS))
        batch.append(ZSchedRun(
            job_id=f"j{rng.randrange(1_000_000):07d}", occurrence=n, status=rng.choice(statuses),
            finished_at=finished, lateness_ms=int(rng.lognormvariate(3, 1.2)),
            wait_ms=rng.randrange(0, 500), duration_ms=rng.randrange(50, 3000),
            stream_id=f"{n}-0"))
        if len(batch) == 5000:
            ZSchedRun.objects.bulk_create(batch)
            batch = []
    ZSchedRun.objects.bulk_create(batch)
    return time.perf_counter() - started


def add_dead_letters(store: Any, count: int = 25) -> None:
    """Dead-letter entries in the layout's ``dead`` sets (the page shows only their count)."""
    now = store.now_ms()
    pipe = store.client.pipeline(transaction=False)
    for i in range(count):
        job_id = f"j{i:07d}"
        pipe.zadd(store.part_of(job_id).dead, {job_id: now - i * 60_000})
    pipe.execute()


# ------------------------------------------------------------------- measuring
def timed(fn: Callable[[], Any], repeat: int, cpu: list[float] | None = None) -> list[float]:
    """Wall ms of each of ``repeat`` calls; this process's CPU ms of each go to ``cpu``."""
    out = []
    for _ in range(repeat):
        started, cpu_started = time.perf_counter(), time.process_time()
        fn()
        out.append((time.perf_counter() - started) * 1000)
        if cpu is not None:
            cpu.append((time.process_time() - cpu_started) * 1000)
    return out


def summary(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {"min": ordered[0], "median": statistics.median(ordered), "p95": p95}


def measure(args: argparse.Namespace, server: RedisServer) -> dict[str, Any]:
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    from celery_zsched.contrib.django import dashboard
    from celery_zsched.contrib.django.conf import get_store

    call_command("migrate", verbosity=0)
    store = get_store()
    out: dict[str, Any] = {"db": args.db, "jobs": args.jobs, "runs": args.runs,
                           "partitions": args.partitions, "renders": args.renders}
    out["load_jobs_s"] = load_jobs(store, args.jobs)
    out["load_runs_s"] = load_runs(args.runs, args.spread_hours)
    add_dead_letters(store)
    out["stats"] = store.stats()
    if args.db == "postgres":
        # What autovacuum does soon after a bulk insert: statistics, and the
        # visibility map that lets index-only scans skip the table.
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE zsched_run")

    user = User.objects.create_superuser("bench", "bench@example.test", "pw")
    client = Client()
    client.force_login(user)
    url = reverse("admin:zsched_dashboard")
    assert client.get(url).status_code == 200  # warm-up: templates, scripts, connections
    gc.collect()

    redis = server.client()
    before = command_calls(redis)
    cpu: list[float] = []
    with CaptureQueriesContext(connection) as queries:
        ms = timed(lambda: client.get(url), args.renders, cpu)
    after = command_calls(redis)
    after.subtract(before)
    # The INFO calls of this measurement are the only foreign commands in the delta.
    commands = sum(v for k, v in after.items() if k != "info") / args.renders
    out["render_ms"] = summary(ms)
    # CPU of this process: Django, the template and (SQLite) the queries; it
    # moves less than wall time when other work shares the cores.
    out["render_cpu_ms"] = summary(cpu)
    out["redis_commands_per_render"] = commands
    out["sql_queries_per_render"] = len(queries) / args.renders

    now = store.now_ms()
    out["parts_ms"] = {
        "due_load (ZCOUNTs)": summary(timed(lambda: dashboard.due_load(store, now), 10)),
        "store.stats()": summary(timed(store.stats, 10)),
        "run_window (SQL)": summary(timed(lambda: dashboard.run_window(store, now), 10)),
    }
    window = dashboard.run_window(store, now)
    out["window_source"] = window.source
    out["window_runs"] = sum(h.runs for h in window.hours)
    return out


def table(result: dict[str, Any]) -> str:
    r, c = result["render_ms"], result["render_cpu_ms"]
    verdict = ", ".join(f"{name} {'PASS' if r[name] < TARGET_MS else 'FAIL'}"
                        for name in ("median", "p95"))
    lines = [
        f"Dashboard render, {result['jobs']:,} jobs in Redis ({result['partitions']} "
        f"partition{'s' if result['partitions'] > 1 else ''}), {result['runs']:,} runs in "
        f"{result['db']} ({result['window_runs']:,} in the window, from "
        f"{result['window_source']}); {result['renders']} renders",
        "",
        "| what | min ms | median ms | p95 ms | note |",
        "|---|---:|---:|---:|---|",
        f"| whole request (test client) | {r['min']:.1f} | {r['median']:.1f} | {r['p95']:.1f} "
        f"| target < {TARGET_MS} ms: {verdict}; {result['redis_commands_per_render']:.0f} "
        f"Redis commands, {result['sql_queries_per_render']:.0f} SQL queries per render |",
        f"| whole request, CPU of the Django process | {c['min']:.1f} | {c['median']:.1f} | "
        f"{c['p95']:.1f} | with SQLite this includes the queries |",
    ]
    for name, s in result["parts_ms"].items():
        lines.append(f"| {name} | {s['min']:.1f} | {s['median']:.1f} | {s['p95']:.1f} | |")
    lines += ["", f"Loading: jobs {result['load_jobs_s']:.1f} s, runs "
                  f"{result['load_runs_s']:.1f} s. Load average at the end: "
                  f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server = RedisServer("dashboard").start()
    try:
        with database(args) as db:
            setup_django(db, server.url(), args.partitions)
            result = measure(args, server)
    finally:
        server.stop()
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
