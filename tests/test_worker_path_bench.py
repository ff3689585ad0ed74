"""Smoke test of benchmarks/worker_path.py: one small round of each variant, counts only.

It runs the script as a person does (a subprocess, which starts and stops its own
throwaway redis-servers). Nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import BENCHMARK_MARKS, run_benchmark

pytestmark = BENCHMARK_MARKS
N = 200


def test_the_worker_path_benchmark_settles_every_execution_of_zsched(tmp_path: Path) -> None:
    out = tmp_path / "path.json"
    rows = run_benchmark("worker_path.py", "--jobs", str(N), "--rounds", "1", "--json",
                         str(out), timeout=300)
    assert [row[0] for row in rows[1:]] == ["bare", "floor", "zsched"], rows
    results = {each["variant"]: each for each in json.loads(out.read_text())}
    assert sorted(results) == ["bare", "floor", "zsched"]
    assert (results["zsched"]["complete"], results["zsched"]["duplicates"]) == (N, 0)
    assert all(each["n"] == N and each["cpu_ms"] > 0 for each in results.values())
