#!/usr/bin/env python
"""Redis CPU per claimed job, and commands per idle claim (issue 23: backpressure per queue).

Usage::

    .venv/bin/python benchmarks/claim_cost.py [--jobs 20000] [--queues 0,4] [--rounds 3]

A throwaway ``redis-server`` (started here, stopped at the end) holds N due jobs;
``Store.claim`` takes them 1,000 at a time (no broker, no publish), and the
server's own CPU (``INFO cpu``) over the drain is divided by the jobs claimed.
``--queues 0`` gives the jobs no ``queue`` field (the claim decodes nothing);
``4`` spreads them over four queues (each definition is decoded for its queue).
The per-queue bound is lifted with the total cap, so nothing is held back: this
is the price of the accounting alone. Then 200 claims with nothing due count the
commands one idle claim runs inside Redis (``INFO commandstats``). CPU time, not
wall time, so a loaded machine skews it less; report min and median.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import RedisServer

from celery_zsched.config import Settings
from celery_zsched.core.job import Job
from celery_zsched.store import Store

IDLE_CLAIMS = 200


def _cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _calls(client: redis.Redis) -> int:
    return sum(int(v["calls"]) for v in client.info("commandstats").values())


def one_round(server: RedisServer, jobs: int, queues: int) -> dict[str, Any]:
    """Drain ``jobs`` due jobs over ``queues`` queues (0: none named) once."""
    client = server.client()
    client.flushall()
    settings = Settings(redis_url=server.url(), key_prefix="{cost}:", max_queued=100_000_000)
    store = Store(client, settings)
    rows = [Job.from_dict({"id": f"j{i:07d}", "url": f"https://example.com/{i}",
                           "interval_s": 3600, "jitter_s": 0,
                           **({"queue": f"q{i % queues}"} if queues else {})})
            for i in range(jobs)]
    store.upsert_many(rows, stagger=False)
    now = store.now_ms()
    pipe = client.pipeline(transaction=False)
    for i, job in enumerate(rows):
        pipe.zadd(store.keys.schedule, {job.id: now - 1000 - i}, xx=True)
    pipe.execute()
    claimed, before = 0, _cpu(client)
    while batch := store.claim().jobs:
        claimed += len(batch)
    cpu_s = _cpu(client) - before
    calls = _calls(client)
    for _ in range(IDLE_CLAIMS):
        store.claim()
    # Every claim is one EVALSHA and its inner commands; the INFO itself is one more.
    idle = (_calls(client) - calls - 1) / IDLE_CLAIMS
    client.close()
    return {"claimed": claimed, "redis_cpu_us_per_job": cpu_s / claimed * 1e6,
            "idle_commands_per_claim": idle}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--queues", default="0,4")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = RedisServer("claim-cost").start()
    try:
        results: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.rounds):
            for queues in (int(q) for q in args.queues.split(",")):
                results.setdefault(f"queues={queues}", []).append(
                    one_round(server, args.jobs, queues))
    finally:
        server.stop()
    print("| case | jobs claimed | Redis CPU us/job, min | median | idle claim: commands |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        per_job = [r["redis_cpu_us_per_job"] for r in runs]
        print(f"| {name} | {runs[-1]['claimed']} | {min(per_job):.2f} | "
              f"{statistics.median(per_job):.2f} | {runs[-1]['idle_commands_per_claim']:g} |")


if __name__ == "__main__":
    main()
