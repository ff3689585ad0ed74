"""Smoke test of benchmarks/cycle.py: one quick round of each variant, counts only.

It runs the script the way a person does (a subprocess), so it starts its own
throwaway redis-servers, ``celery beat`` and prefork ``celery worker``
processes, and stops them all. Nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import BENCHMARK_MARKS, run_benchmark

pytest.importorskip("psutil")

pytestmark = BENCHMARK_MARKS
N = 500  # --quick


def test_the_cycle_benchmark_counts_every_execution_of_both_variants(tmp_path: Path) -> None:
    out = tmp_path / "cycle.json"
    rows = run_benchmark("cycle.py", "--quick", "--json", str(out), timeout=240)

    rounds = [row for row in rows if row[0] == "1"]
    assert [row[1] for row in rounds] == ["plain", "zsched"], rows
    assert rounds[0][-1] == f"{N} ran", rows
    assert rounds[1][-1] == f"{N} ran, {N} settled, 0 duplicates", rows
    summary = {row[0]: row for row in rows if row[0] not in ("1", "round", "metric")}
    for metric in ("executions/s", "worker-tree CPU ms/execution",
                   "total CPU ms/execution (worker + beat + store + broker)",
                   "broker Redis commands/execution"):
        assert summary[metric][5].endswith("x"), (metric, rows)  # a zsched/plain ratio
    assert summary["store Redis commands/execution (incl. inside Lua)"][1] == "-"  # no store

    results = json.loads(out.read_text())
    plain, zsched = results["rounds"]
    assert (plain["variant"], plain["n"], plain["ran"]) == ("plain", N, N)
    assert plain["store_cmds"] is None and plain["counters"] == {}
    assert (zsched["variant"], zsched["n"], zsched["ran"], zsched["created"]) == \
        ("zsched", N, N, N)
    counters = zsched["counters"]
    assert counters["promoted"] == counters["started"] == counters["complete"] == N, counters
    assert counters.get("duplicates", 0) == counters.get("error", 0) == 0, counters
    # Every execution went through the store: one start and one settle script each.
    assert zsched["store_cmds"]["evalsha"] >= 2 * N, zsched["store_cmds"]
    assert zsched["broker_cmds"]["lpush"] == plain["broker_cmds"]["lpush"] == N
