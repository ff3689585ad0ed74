"""Smoke test of benchmarks/claim_cost.py: one small round of each case, counts only."""

from __future__ import annotations

from tests.helpers import BENCHMARK_MARKS, run_benchmark

pytestmark = BENCHMARK_MARKS


def test_the_claim_cost_benchmark_claims_every_job_and_counts_an_idle_claim() -> None:
    rows = run_benchmark("claim_cost.py", "--jobs", "300", "--rounds", "1", timeout=120)
    cases = {row[0]: row for row in rows if row[0].startswith("queues=")}
    assert set(cases) == {"queues=0", "queues=4"}, rows
    for row in cases.values():
        assert row[1] == "300" and float(row[2]) > 0, row
        # One EVALSHA and the commands inside it, whatever the number of jobs.
        assert row[4] == "8", row
