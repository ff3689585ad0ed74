#!/usr/bin/env python
"""Benchmark the capacity planner (issue 22): one scan of the schedule, and the reads after it.

Usage::

    python benchmarks/planner.py [--jobs 1000000] [--domains 10000] [--rounds 3]
        [--json out.json]

A throwaway ``redis-server`` (no persistence, free port; 127.0.0.1:6379 is never
touched) gets ``--jobs`` interval jobs over ``--domains`` domains through the
store's bulk path (intervals drawn from 60 s to a day, 2% cron jobs, 1% paused).
Then, ``--rounds`` times each:

- **scan**: :func:`celery_zsched.services.planner.demand` with ``fresh=True``: the
  full ``HSCAN`` of the definitions, a JSON parse per job, the sums, the write;
- **shared read**: the same call inside the refresh period (what every
  ``zsched domains``, admin page and scrape pays between scans);
- **plans**: :func:`~celery_zsched.services.planner.domain_plans` on that result
  (the live pacing of every domain, joined to it).

Prints min and median of the rounds (wall clock, and the scan's CPU time in this
process: the machine may be loaded; Redis' own time is in the wall clock only), the
planner's process memory growth (``ru_maxrss``) and the stored result's size. A
script, not a test: nothing is asserted (``tests/test_planner.py`` runs it small).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import RedisServer

from celery_zsched.config import Settings
from celery_zsched.core.job import Job
from celery_zsched.services import planner
from celery_zsched.store import Store

CHUNK = 20_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--domains", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args(argv)


def load(store: Store, jobs: int, domains: int) -> float:
    """Store ``jobs`` jobs over ``domains`` domains; the seconds it took."""
    rng = random.Random(22)
    intervals = [60, 300, 900, 3600, 21_600, 86_400]
    started = time.perf_counter()
    for first in range(0, jobs, CHUNK):
        rows = []
        for i in range(first, min(jobs, first + CHUNK)):
            host = f"site{rng.randrange(domains)}.example"
            timing: dict[str, Any] = ({"cron": "*/15 * * * *"} if i % 50 == 0
                                      else {"interval_s": rng.choice(intervals)})
            rows.append(Job.from_dict({"id": f"j{i}", "url": f"http://{host}/p/{i}",
                                       "jitter_s": 0, **timing}))
        store.upsert_many(rows, total=len(rows))
    store.pause(*[f"j{i}" for i in range(0, jobs, 100)])
    return time.perf_counter() - started


CPU: list[float] = []


def timed(call: Any, rounds: int) -> list[float]:
    """Wall seconds of each round; this process's CPU seconds go to ``CPU`` (on a
    loaded machine the wall clock mostly measures waiting for a core)."""
    out = []
    CPU.clear()
    for _ in range(rounds):
        started, cpu = time.perf_counter(), time.process_time()
        call()
        out.append(time.perf_counter() - started)
        CPU.append(time.process_time() - cpu)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    server = RedisServer("planner").start()
    try:
        store = Store.from_settings(Settings(redis_url=server.url(), pacing=True))
        load_s = load(store, args.jobs, args.domains)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        scans = timed(lambda: planner.demand(store, fresh=True), args.rounds)
        scan_cpu = list(CPU)
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        reads = timed(lambda: planner.demand(store), args.rounds)
        plans = timed(lambda: planner.domain_plans(store), args.rounds)
        result = planner.demand(store)
        stored = len(store.client.get(store.keys.planner) or "")
        over = sum(p.oversubscribed for p in planner.domain_plans(store)[1].values())
    finally:
        server.stop()
    out = {"jobs": args.jobs, "domains": args.domains, "load_s": round(load_s, 1),
           "scanned_jobs": result.jobs, "domains_with_jobs": len(result.loads),
           "oversubscribed": over, "stored_bytes": stored,
           "rss_growth_mb": round((rss_after - rss_before) / 1024, 1)}
    for name, values in (("scan_s", scans), ("scan_cpu_s", scan_cpu),
                         ("shared_read_s", reads), ("plans_s", plans)):
        out[name] = {"min": round(min(values), 4), "median": round(statistics.median(values), 4)}
    print(f"| measure ({args.jobs:,} jobs, {args.domains:,} domains) | min | median |")
    print("|---|---|---|")
    for name in ("scan_s", "scan_cpu_s", "shared_read_s", "plans_s"):
        print(f"| {name} | {out[name]['min']} | {out[name]['median']} |")
    print(f"\nscanned {result.jobs:,} enabled jobs, {len(result.loads):,} domains, "
          f"{over:,} over-subscribed; stored result {stored:,} bytes; "
          f"scan memory growth {out['rss_growth_mb']} MB (ru_maxrss)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
