#!/usr/bin/env python
"""What a worker's pool process spends per execution around the task body, measured
in one process: quieter than the full cycle (``cycle.py``), where the variants'
differences drown in the noise of eight processes sharing two cores.

Usage::

    .venv/bin/python benchmarks/worker_path.py [--jobs 3000] [--rounds 7]
        [--before DIR] [--json out.json]

Each round runs each variant once, interleaved, each in a fresh process with a
throwaway ``redis-server`` of its own (the store), the process pinned to one
CPU and the server to another where there are two:

* **bare**: Celery's tracer (``Task.apply``, which runs the same hooks and
  signals a pool process does) running a noop task N times that INCRs a
  counter in that Redis; no zsched hook is connected.
* **floor**: bare, plus exactly the two store round trips DESIGN asks for per
  execution, a Lua script that does nothing before the body (waited for) and
  after it (sent ahead, its reply read with the next start's):
  ``cycle.py``'s floor.
* **zsched**: the worker hooks (``celery_zsched.worker``) with settles sent
  ahead as in a worker process, each execution a real occurrence: N jobs
  stored, claimed and routed as beat does, and each run with the headers beat
  gives its message (``beat.publish.headers_of``), so each start and settle is
  the real compare-and-set.
* **before** (``--before DIR``): zsched, importing the package from ``DIR``
  (a git worktree of an earlier commit).

Reported per variant: the CPU time (user + system) per execution of the
process, and of the store's Redis (``INFO cpu``), min and median over the
rounds; then each variant above bare and above the floor. Not measured here:
the worker's main process (receipt, hold, acknowledgement), beat and the
broker: ``cycle.py`` measures the whole cycle.

This is a script, not a test: nothing is asserted but that every execution of
the zsched variants settled.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import RedisServer, _redis_cpu_s

VARIANTS = ("bare", "floor", "zsched", "before")
TASK = "cycle.noop"
PREFIX = "{path}:"


def _pin(server_pid: int) -> None:
    """This process on one CPU, the server on another, where there are two."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        os.sched_setaffinity(server_pid, {cpus[1]})
        os.sched_setaffinity(0, {cpus[0]})


def child(variant: str, n: int) -> dict[str, Any]:
    """One variant's N executions in this process; CPU per execution of it and its store."""
    server = RedisServer("path").start()
    try:
        _pin(server.proc.pid if server.proc else 0)
        # Backpressure would stop the claims at 2,000 queued: all N are queued at once here.
        os.environ.update(ZSCHED_REDIS_URL=server.url(), ZSCHED_KEY_PREFIX=PREFIX,
                          ZSCHED_MAX_QUEUED=str(n), ZSCHED_QUEUE_MAX_QUEUED=str(n))
        import redis
        from celery import Celery

        app = Celery("zsched_worker_path", broker="memory://", set_as_current=False)
        app.conf.task_eager_propagates = True
        counter = redis.Redis.from_url(server.url())

        @app.task(name=TASK)
        def noop(i: int = 0) -> None:
            counter.incr("done")

        headers: list[dict[str, Any] | None] = [None] * n
        client: Any = counter
        if variant == "floor":
            from cycle import install_floor
            install_floor(server.url())
        elif variant in ("zsched", "before"):
            headers, client = _zsched(app, n, variant)
        noop.apply(kwargs={"i": 0})  # warm: the tracer is built on first use
        cpu, redis_cpu = time.process_time(), _redis_cpu_s(client)
        for each in headers:
            noop.apply(kwargs={"i": 1}, headers=each, task_id=str(uuid.uuid4()))
        if variant in ("zsched", "before"):
            from celery_zsched.worker.settle import collect_all
            collect_all()
        cpu, redis_cpu = time.process_time() - cpu, _redis_cpu_s(client) - redis_cpu
        out: dict[str, Any] = {"variant": variant, "n": n, "cpu_ms": cpu * 1000 / n,
                               "redis_ms": redis_cpu * 1000 / n}
        if variant in ("zsched", "before"):
            from celery_zsched.services.appstore import store_for_app
            store = store_for_app(app)
            out["complete"] = int(store.client.hget(store.keys.counters, "complete") or 0)
            out["duplicates"] = int(store.client.hget(store.keys.counters, "duplicates") or 0)
        return out
    finally:
        server.stop()


def _zsched(app: Any, n: int, variant: str) -> tuple[list[dict[str, Any] | None], Any]:
    """N occurrences stored, claimed and routed as beat does: their messages' headers."""
    from celery_zsched.beat.publish import headers_of
    from celery_zsched.core.job import Job
    from celery_zsched.services.appstore import store_for_app
    from celery_zsched.store import scripts
    from celery_zsched.worker import install_start
    from celery_zsched.worker.settle import send_ahead

    if variant == "before":
        from cycle import check_before_import
        check_before_import()
    install_start(app)
    send_ahead()  # as in a worker process
    from celery import signals
    app.set_current()  # as a pool process's is, when it is told it started
    signals.worker_process_init.send(sender="worker_path")
    store = store_for_app(app)
    for name in ("start", "settle"):  # as on a server any worker has used
        store.client.script_load(scripts.source(name))
    store.upsert_many([Job.from_dict({"id": f"job-{i}", "task": TASK, "interval_s": 604800,
                                      "jitter_s": 0}) for i in range(n)], stagger=False)
    claimed: list[Any] = []
    for _ in range(1000):
        if len(claimed) >= n:
            break
        batch = store.claim(1000)
        claimed += batch.jobs
        if not batch.jobs:
            time.sleep(0.01)  # due a moment after now: the claim's clock is Redis'
    if len(claimed) < n:
        raise RuntimeError(f"claimed {len(claimed):,} of {n:,} jobs")
    store.routed([(each, "celery") for each in claimed])
    return [headers_of(each, None) for each in claimed], store.client


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    variants = [v for v in VARIANTS if v != "before" or args.before]
    here = Path(__file__).resolve()
    results = []
    for rnd in range(1, args.rounds + 1):
        for variant in variants:
            env = dict(os.environ)
            if variant == "before":
                from cycle import before_env
                env.update(before_env(args.before, args.workdir))
            proc = subprocess.run([sys.executable, str(here), "--child", variant,
                                   "--jobs", str(args.jobs)], env=env, capture_output=True,
                                  text=True, check=False, cwd=args.workdir)
            if proc.returncode != 0:
                raise SystemExit(f"{variant} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
            out = json.loads(proc.stdout.strip().splitlines()[-1])
            out["round"] = rnd
            results.append(out)
            print(f"round {rnd} {variant}: {out['cpu_ms']:.3f} ms/execution, store Redis "
                  f"{out['redis_ms']:.3f} ms" + (f", {out['complete']:,} settled, "
                                                 f"{out['duplicates']} duplicates"
                                                 if "complete" in out else ""), flush=True)
    return results


def table(results: list[dict[str, Any]]) -> str:
    by: dict[str, list[dict[str, Any]]] = {}
    for each in results:
        by.setdefault(each["variant"], []).append(each)

    def stat(variant: str, key: str, how: Any) -> float:
        return float(how([each[key] for each in by[variant]]))
    rows = ["| variant | process CPU ms/execution, min / median | store Redis CPU ms/execution, "
            "min / median | process above bare (medians) | process above floor (medians) "
            "| store Redis above floor (medians) |", "|---|---|---|---|---|---|"]
    for variant in by:
        cells = [variant] + [f"{stat(variant, key, min):.3f} / "
                             f"{stat(variant, key, statistics.median):.3f}"
                             for key in ("cpu_ms", "redis_ms")]
        for base, key in (("bare", "cpu_ms"), ("floor", "cpu_ms"), ("floor", "redis_ms")):
            if base not in by or VARIANTS.index(variant) <= VARIANTS.index(base):
                cells.append("-")
                continue
            above = stat(variant, key, statistics.median) - stat(base, key, statistics.median)
            cells.append(f"{above:+.3f} ms")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=3000, help="executions per run, N")
    p.add_argument("--rounds", type=int, default=7, help="runs of each variant, interleaved")
    p.add_argument("--before", default="", help="a checkout of an earlier commit to compare")
    p.add_argument("--json", help="also write raw results to this file")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.jobs)))
        return
    import tempfile
    with tempfile.TemporaryDirectory(prefix="zsched-worker-path-") as workdir:
        args.workdir = workdir
        results = run(args)
    print(f"\nN = {args.jobs:,} executions per run, {args.rounds} rounds, interleaved; "
          f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f} at the end.\n")
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
