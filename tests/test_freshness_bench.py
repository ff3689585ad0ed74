"""Smoke test of benchmarks/freshness.py --quick: a simulated site, real beat and prefork
workers, two fixed runs and the allocation on the fixed interval's budget, and a table of
what each measured."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("psutil")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]

ROOT = Path(__file__).resolve().parents[1]


def test_the_quick_freshness_benchmark_measures_three_runs(tmp_path: Path) -> None:
    out = tmp_path / "fresh.json"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ZSCHED_", "CELERY_", "DJANGO_SETTINGS_MODULE"))}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "freshness.py"), "--quick",
         "--json", str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "allocation: freshness" in proc.stdout, proc.stdout
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert [r["policy"] for r in runs] == ["fixed (same fetches)", "fixed (2x fetches)",
                                           "allocation"]
    # The allocation spends at most the fixed interval's budget (its pacing delay),
    # give or take the fetches in flight at the window's edges.
    assert runs[2]["fetches"] <= runs[0]["fetches"] * 1.1, runs
    for run in runs:
        assert 0 < run["freshness"] <= 1 and run["fetches"] > 0, run
        # Conditional requests: unchanged pages answered 304 without a body.
        assert run["not_modified"] > 0 and run["bytes"] < run["fetches"] * 2048, run
