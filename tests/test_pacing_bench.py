"""Smoke test of benchmarks/pacing.py: every part (fleet, drain, cost, idle), tiny sizes.

It runs the script the way a person does (a subprocess), so it starts its own
throwaway redis-servers, HTTP target, ``celery beat`` and prefork ``celery
worker`` processes, and stops them all.
"""

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


def _cell(rows: list[list[str]], prefix: str, column: int = 1) -> str:
    row = next((row for row in rows if row[0].startswith(prefix)), None)
    assert row is not None, f"no row starting {prefix!r}"
    return row[column]


def test_the_pacing_benchmark_runs_every_part_and_stays_polite(tmp_path: Path) -> None:
    out = tmp_path / "pacing.json"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ZSCHED_", "CELERY_", "DJANGO_SETTINGS_MODULE"))}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "pacing.py"), "--quick", "--jobs", "300",
         "--domains", "20", "--window-s", "5", "--capacity-jobs", "2000",
         "--capacity-window-s", "3", "--workers", "1", "--concurrency", "2",
         # The starts are spaced in Redis; each request reaches the target a few
         # ms after its start, more on a loaded machine: this bound only catches
         # pacing that does not hold, not scheduling jitter.
         "--tolerance-ms", "250",
         "--drain-jobs", "2000", "--cost-jobs", "2000", "--idle-sizes", "500", "--idle-ticks", "20",
         "--json", str(out)],
        capture_output=True, text=True, timeout=240, env=env, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]

    rows = [line.strip("| ").split(" | ") for line in proc.stdout.splitlines()
            if line.startswith("| ")]
    # What the core enforces: no two starts of one domain closer than its delay.
    assert _cell(rows, "violations between the starts").startswith("0 of "), proc.stdout
    assert _cell(rows, "violations beyond 250 ms") == "0", proc.stdout
    assert int(_cell(rows, "domains hit").replace(",", "")) == 20, proc.stdout
    assert _cell(rows, "cost ratio, pacing on (own domains) / off")[0].isdigit(), proc.stdout
    # The drain: a real beat promoted every job, both sides, none held (own domains).
    assert _cell(rows, "drain ratio, pacing on / off")[0].isdigit(), proc.stdout
    assert _cell(rows, "pacing on, every job its own domain", 4)[0].isdigit(), proc.stdout
    assert any(row[0] == "500" for row in rows), proc.stdout  # the idle row of N = 500

    results = json.loads(out.read_text())
    paced = results["fleet"]["paced"]
    assert paced["start_violations"] == 0 and paced["start_gaps"] > 0
    assert paced["host_mismatch"] == 0
    assert paced["counters"].get("duplicates", 0) == 0
    assert results["fleet"]["unpaced"]["requests"] > 0
    best = results["cost"]["best"]
    assert best["own"]["claimed"] == best["off"]["claimed"] == 2000
    assert best["shared"]["claimed"] == 20  # one per domain; the rest held
    for side in ("off", "on"):
        run = results["drain"]["best"][side]
        assert run["counters"]["promoted"] == run["broker_queued"] == 2000, run
        assert run["counters"].get("held", 0) == 0, run
    assert results["drain"]["best"]["on"]["domain_records"] == 2000
