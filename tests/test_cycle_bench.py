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
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_the_cycle_benchmark_counts_every_execution_of_each_variant(tmp_path: Path) -> None:
    out = tmp_path / "cycle.json"
    rows = run_benchmark("cycle.py", "--quick", "--floor", "--json", str(out), timeout=300)

    rounds = [row for row in rows if row[0] == "1"]
    assert [row[1] for row in rounds] == ["plain", "zsched", "floor"], rows
    assert rounds[0][-1] == f"{N} ran", rows
    assert rounds[1][-1] == f"{N} ran, {N} settled, 0 duplicates", rows
    summary = {row[0]: row for row in rows if row[0] not in ("1", "round", "metric")}
    for metric in ("executions/s", "worker-tree CPU ms/execution",
                   "total CPU ms/execution (worker + beat + store + broker)",
                   "broker Redis commands/execution"):
        # zsched/plain and floor/plain ratios
        assert all(cell.endswith("x") for cell in summary[metric][7:11]), (metric, rows)
    assert summary["store Redis commands/execution (incl. inside Lua)"][1] == "-"  # no store

    results = json.loads(out.read_text())
    plain, zsched, floor = results["rounds"]
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
    # The floor: plain Celery plus exactly one empty script call before each body and
    # one after it, on the store, and nothing else there.
    assert (floor["variant"], floor["n"], floor["ran"]) == ("floor", N, N)
    setup = {name: calls for name, calls in floor["store_cmds"].items() if name != "evalsha"}
    assert floor["store_cmds"]["evalsha"] == 2 * N and sum(setup.values()) < 20, setup
    assert floor["broker_cmds"]["lpush"] == N


def test_the_before_variant_imports_the_old_checkout_not_the_installed_one(
        tmp_path: Path) -> None:
    """``--before DIR`` compares against DIR's code: an editable install of this
    checkout (how the project installs itself) must not answer its imports."""
    import os
    import subprocess
    import sys

    sys.path.insert(0, str(BENCHMARKS))
    try:
        import cycle
    finally:
        sys.path.remove(str(BENCHMARKS))
    old = tmp_path / "old"
    (old / "celery_zsched").mkdir(parents=True)
    (old / "celery_zsched" / "__init__.py").write_text("OLD = True\n")
    env = {**os.environ, **cycle.before_env(str(old), str(tmp_path))}
    found = subprocess.run(
        [sys.executable, "-c", "import celery_zsched; print(celery_zsched.__file__)"],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(found).resolve() == (old / "celery_zsched" / "__init__.py").resolve()
