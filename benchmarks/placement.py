#!/usr/bin/env python
"""What placing paced jobs by domain costs (issue 23): import, lookups by id, the claim.

Usage::

    .venv/bin/python benchmarks/placement.py [--jobs 100000] [--domains 1000]
        [--rounds 3] [--json out.json]

Three layouts of the same N URL jobs over D domains, each on a throwaway
``redis-server`` (127.0.0.1:6379 is never used):

* ``1 (paced)``: one partition, pacing on (the only paced layout before);
* ``12 by id``: twelve partitions, pacing off (jobs by ``crc32(id)``);
* ``12/domain (paced)``: twelve partitions, pacing on: each paced job in its
  domain's partition, a directory entry for each one away from its id's own.

Per layout: the staggered import (jobs/s), ``get_many`` of 1,000 ids by id alone
(ms: by domain, one directory lookup first), and a claim storm: every job made
due, then ``claim_parts`` over every partition until nothing is claimed (jobs/s;
with pacing on, the domains' gates hold most back, so it counts claimed + held).
Min and median of ``--rounds`` rounds. A script, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench import RedisServer
from celery_zsched.config import Settings
from celery_zsched.core.job import Job
from celery_zsched.store import Store

LAYOUTS = {"1 (paced)": {"partitions": 1, "pacing": True},
           "12 by id": {"partitions": 12, "pacing": False},
           "12/domain (paced)": {"partitions": 12, "pacing": True}}


def fleet(n: int, domains: int) -> list[Job]:
    return [Job.from_dict({"url": f"https://d{i % domains}.example/p/{i}", "interval_s": 3600,
                           "jitter_s": 0}) for i in range(n)]


def one_round(url: str, jobs: list[Job], layout: dict[str, Any], tag: str) -> dict[str, float]:
    store = Store.from_settings(Settings(redis_url=url, key_prefix=f"{{pl{tag}}}:", **layout))
    store.now_ms()
    started = time.perf_counter()
    store.upsert_many(jobs, stagger=True)
    imported = len(jobs) / (time.perf_counter() - started)
    ids = [j.id for j in jobs[::max(1, len(jobs) // 1000)]][:1000]
    started = time.perf_counter()
    assert all(store.get_many(ids))
    lookup_ms = (time.perf_counter() - started) * 1000
    now = store.now_ms()
    for part, members in store.group([j.id for j in jobs]).items():
        store.client.zadd(store.parts[part].schedule, dict.fromkeys(members, now - 1), xx=True)
    plan = dict.fromkeys(range(store.partitions), 1000 // store.partitions or 1)
    taken, started = 0, time.perf_counter()
    while True:
        batches = store.claim_parts(plan)
        got = sum(b.taken for b in batches.values())
        if not got:
            break
        taken += got
        store.release([c for b in batches.values() for c in b.jobs])
        # released jobs are due again: stop once every job was dealt with once
        if taken >= len(jobs):
            break
    claim_rate = taken / (time.perf_counter() - started)
    store.client.flushdb()
    return {"import_jobs_s": imported, "get_many_1000_ms": lookup_ms, "claim_jobs_s": claim_rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--domains", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    server = RedisServer("placement").start()
    try:
        jobs = fleet(args.jobs, args.domains)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in LAYOUTS}
        for r in range(args.rounds):  # interleaved: the box's load hits every layout alike
            for name, layout in LAYOUTS.items():
                results[name].append(one_round(server.url(), jobs, layout, f"{r}"))
    finally:
        server.stop()
    print(f"\n{args.jobs:,} jobs over {args.domains:,} domains, {args.rounds} rounds "
          "(min / median)\n")
    print("| layout | import (jobs/s) | get_many 1,000 ids (ms) | claim storm (jobs/s) |")
    print("|---|---|---|---|")
    for name, rows in results.items():
        cells = []
        for key, best in (("import_jobs_s", max), ("get_many_1000_ms", min),
                          ("claim_jobs_s", max)):
            values = [row[key] for row in rows]
            cells.append(f"{best(values):,.0f} / {statistics.median(values):,.0f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
