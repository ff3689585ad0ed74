#!/usr/bin/env python
"""What the audit trail costs a bulk import: the same import with and without it.

Usage::

    .venv/bin/python benchmarks/audit_import.py [--sizes 100000] [--rounds 3] [--json out.json]

For each size, fresh stores are filled by ``Store.upsert_many`` (staggered,
as the importer stores), alternating ``zsched_audit_maxlen=0`` (no trail) and
the default (one audit entry per created job, written by the upsert script in
the same call). Then the same jobs are stored again (an unchanged re-import:
no entry), then once more with every definition changed (one ``edit`` entry
per job, with its diff). Rows are validated before the timing, so the times are
the store's alone. It reports rows/s, Redis CPU per row, and the memory of the
audit stream. Runs against a throwaway ``redis-server`` that it starts on a
free port and stops at the end; 127.0.0.1:6379 is never used.

This is a script, not a test: it prints a table, and asserts nothing.
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

from benchmarks.bench import RedisServer, _redis_cpu_s
from celery_zsched.config import Settings
from celery_zsched.core.job import Job
from celery_zsched.store import Store

MiB = 1024 * 1024


def jobs(n: int, name: str = "") -> list[Job]:
    """``n`` interval URL jobs with explicit ids (``name`` changes every definition)."""
    return [Job.from_dict({"id": f"a{i:07d}", "url": f"https://site{i % 5000}.example/p/{i}",
                           "interval_s": 3600, "name": name, "meta": {"n": i}})
            for i in range(n)]


def timed(store: Store, batch: list[Job]) -> tuple[float, float]:
    """(seconds, Redis CPU seconds) of one staggered ``upsert_many`` of ``batch``."""
    cpu = _redis_cpu_s(store.client)
    started = time.perf_counter()
    store.upsert_many(batch, stagger=True, total=len(batch))
    return time.perf_counter() - started, _redis_cpu_s(store.client) - cpu


def one_round(url: str, n: int, audit: bool, tag: str) -> dict[str, Any]:
    settings = Settings(redis_url=url, key_prefix=f"{{audit{tag}}}:",
                        audit_maxlen=100_000 if audit else 0)
    store = Store.from_settings(settings)
    store.now_ms()  # connect outside the timing
    first, second, changed = jobs(n), jobs(n), jobs(n, name="renamed")
    create_s, create_cpu = timed(store, first)
    same_s, same_cpu = timed(store, second)
    edit_s, edit_cpu = timed(store, changed)
    stream = store.keys.audit
    entries = int(store.client.xlen(stream))
    memory = int(store.client.memory_usage(stream) or 0) if entries else 0
    store.client.delete(*store.keys.all())
    store.client.close()
    return {"audit": audit, "n": n, "create_s": create_s, "create_cpu_s": create_cpu,
            "reimport_s": same_s, "reimport_cpu_s": same_cpu, "edit_s": edit_s,
            "edit_cpu_s": edit_cpu, "stream_entries": entries, "stream_mib": memory / MiB}


def summary(rows: list[dict[str, Any]], n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"n": n}
    for audit in (False, True):
        mine = [r for r in rows if r["audit"] is audit]
        label = "audit" if audit else "no_audit"
        for step in ("create", "reimport", "edit"):
            out[f"{label}_{step}_rows_per_s"] = n / statistics.median(
                r[f"{step}_s"] for r in mine)
            out[f"{label}_{step}_redis_us_per_row"] = 1e6 * statistics.median(
                r[f"{step}_cpu_s"] for r in mine) / n
        out[f"{label}_stream_entries"] = mine[-1]["stream_entries"]
        out[f"{label}_stream_mib"] = mine[-1]["stream_mib"]
    for step in ("create", "reimport", "edit"):
        out[f"{step}_cost_pct"] = 100 * (out[f"no_audit_{step}_rows_per_s"]
                                         / out[f"audit_{step}_rows_per_s"] - 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", default="100000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    server = RedisServer("audit").start()
    results = []
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            rows = [one_round(server.url(), n, audit, f"{n}-{r}-{audit}")
                    for r in range(args.rounds) for audit in (False, True)]
            results.append(summary(rows, n))
    finally:
        server.stop()
    for result in results:
        n = result["n"]
        print(f"\nimport of {n:,} jobs, median of {args.rounds} rounds "
              "(rows/s, Redis CPU us/row):")
        print(f"{'step':<28}{'no audit':>20}{'audit':>20}{'cost':>10}")
        for step, label in (("create", "create (new jobs)"),
                            ("reimport", "re-import (unchanged)"),
                            ("edit", "re-import (all changed)")):
            cells = [f"{result[f'{k}_{step}_rows_per_s']:,.0f} "
                     f"({result[f'{k}_{step}_redis_us_per_row']:.1f})"
                     for k in ("no_audit", "audit")]
            print(f"{label:<28}{cells[0]:>20}{cells[1]:>20}{result[f'{step}_cost_pct']:>9.1f}%")
        print(f"audit stream after the run: {result['audit_stream_entries']:,} entries, "
              f"{result['audit_stream_mib']:.1f} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
