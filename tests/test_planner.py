"""The capacity planner: demand against pacing capacity per domain, the lateness it
predicts (checked against a simulation of the claim's slots), the shared scan,
and where an over-subscribed domain shows: ``zsched domains``, the exporter.

Real Redis (the throwaway server); the CLI runs in-process through Celery's own.
"""

from __future__ import annotations

import heapq
import json
import os
import random
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from celery_zsched.core.job import Job
from celery_zsched.core.planner import DAY_S, DomainLoad, demanded_interval, plan
from celery_zsched.core.recrawl import Visit
from celery_zsched.metrics.exporter import StoreCollector
from celery_zsched.services import planner
from celery_zsched.store import Store
from tests.cli_env import cli_prefix, invoke

Make = Callable[..., Store]


def _job(url: str, **fields: Any) -> Job:
    return Job.from_dict({"url": url, "jitter_s": 0, **fields})


def _fleet(store: Store, host: str, n: int, interval_s: float) -> list[Job]:
    jobs = [_job(f"http://{host}/p/{i}", interval_s=interval_s) for i in range(n)]
    store.upsert_many(jobs)
    return jobs


# ------------------------------------------------------------------ the model
def test_a_jobs_demanded_interval_is_its_interval_or_its_crons_mean_spacing() -> None:
    assert demanded_interval(_job("http://a.example/", interval_s=300)) == 300
    assert demanded_interval(_job("http://a.example/", cron="*/15 * * * *")) == 900
    # Weekdays at 9: five fires a week, so a fire every 7/5 days on average.
    weekdays = _job("http://a.example/", cron="0 9 * * 1-5", timezone="Europe/Berlin")
    assert demanded_interval(weekdays) == pytest.approx(7 * DAY_S / 5)
    assert demanded_interval(_job("http://a.example/", run_at="2030-01-01T00:00:00Z")) is None


def test_capacity_is_one_start_per_delay_and_the_ratio_flags_oversubscription() -> None:
    load = DomainLoad()
    for _ in range(100):
        load.add(60)  # 100 jobs a minute apart: 144,000 fetches a day
    over = plan("a.example", load, delay_s=1.0)  # pacing allows 86,400
    assert over.capacity_per_day == DAY_S
    assert over.demand_per_day == pytest.approx(144_000)
    assert over.ratio == pytest.approx(144_000 / 86_400) and over.oversubscribed
    # One interval: every run waits interval * (ratio - 1).
    assert over.lateness_s == pytest.approx(60 * (144_000 / 86_400 - 1), rel=1e-6)
    fine = plan("a.example", load, delay_s=0.5)
    assert not fine.oversubscribed and fine.lateness_s == 0
    unpaced = plan("a.example", load, delay_s=0)
    assert (unpaced.capacity_per_day, unpaced.ratio) == (None, 0.0)


def _simulate(intervals: list[float], delay_s: float, runs: int) -> float:
    """Mean lateness of the claim's slots: one start per ``delay_s``, earliest due
    first, each job due again its interval after it ran (settled at once). First
    runs are staggered across each interval, as an import staggers them."""
    rng = random.Random(22)
    due = [(rng.random() * interval, i) for i, interval in enumerate(intervals)]
    heapq.heapify(due)
    t, late = 0.0, []
    for _ in range(runs):
        at, i = heapq.heappop(due)
        t = max(t + delay_s, at)
        late.append(t - at)
        heapq.heappush(due, (t + intervals[i], i))
    return statistics.fmean(late[runs // 2:])  # the steady state: the second half


@pytest.mark.parametrize(("intervals", "delay_s"), [
    ([60.0] * 100, 1.0),
    ([30.0] * 50 + [300.0] * 200, 0.9),
    ([10.0] * 5 + [120.0] * 40 + [3600.0] * 300, 1.5),
])
def test_the_lateness_estimate_matches_a_simulation_of_the_slots(
        intervals: list[float], delay_s: float) -> None:
    load = DomainLoad()
    for interval in intervals:
        load.add(interval)
    estimate = plan("d", load, delay_s)
    assert estimate.oversubscribed
    # Earliest due first gives every job the same wait: the estimate's premise.
    assert estimate.lateness_s == pytest.approx(_simulate(intervals, delay_s, 200_000), rel=0.05)


def test_distinct_intervals_past_the_cap_are_merged_not_dropped() -> None:
    load = DomainLoad()
    for i in range(1, 500):
        load.add(float(i * 7))
    assert load.jobs == 499 and sum(load.intervals.values()) == 499
    assert len(load.intervals) <= 64
    assert DomainLoad.from_json(json.loads(json.dumps(load.to_json()))).intervals == \
        load.intervals


# ------------------------------------------------------------- the shared scan
def test_the_scan_sums_enabled_jobs_per_domain(make_store: Make) -> None:
    store = make_store(pacing=True)
    _fleet(store, "busy.example", 10, 60)
    _fleet(store, "calm.example", 3, 3600)
    paused = _fleet(store, "paused.example", 4, 60)
    store.pause(*[j.id for j in paused])
    store.upsert(_job("http://busy.example/cron", cron="*/15 * * * *"))
    store.upsert(_job("http://busy.example/once", run_at="2030-01-01T00:00:00Z"))
    # No URL and no domain: not paced, not planned.
    store.upsert(Job.from_dict({"id": "no-url", "task": "noop", "interval_s": 5}))
    result = planner.demand(store)
    assert sorted(result.loads) == ["busy.example", "calm.example"]
    busy = result.loads["busy.example"]
    assert busy.jobs == 11
    assert busy.demand == pytest.approx(10 * 1440 + 96)
    assert busy.intervals == Counter({60.0: 10, 900.0: 1})
    assert result.jobs == 14


def _settle_unchanged(store: Store, ids: list[str], rounds: int) -> None:
    """``rounds`` runs of each of ``ids`` that each saw no change, the last one made a
    minute earlier on Redis' clock (a history that covers time). Other jobs the
    claims hand out are settled without a report."""
    for _ in range(rounds):
        for job_id in ids:
            store.run_now(job_id)
        claimed = store.claim().jobs
        assert set(ids) <= {c.job.id for c in claimed}
        for c in claimed:
            keys = store.part_of(c.job.id)
            raw = json.loads(store.client.hget(keys.state, c.job.id))
            if "hl" in raw:
                raw["hl"] = store.now_ms() - 60_000
                store.client.hset(keys.state, c.job.id, json.dumps(raw))
            visit = Visit(changed=False) if c.job.id in ids else Visit()
            assert store.settle(c.job.id, c.occurrence, c.attempt, "complete",
                                visit=visit).applied


def test_the_scan_counts_an_adaptive_jobs_interval_in_force(make_store: Make) -> None:
    store = make_store()
    fixed = _fleet(store, "site.example", 2, 60)
    adaptive = [_job(f"http://site.example/a/{i}", interval_s=60, recrawl="adaptive",
                     max_interval_s=600) for i in range(4)]
    store.upsert_many(adaptive)
    # Three pages never seen to change: their settles choose the upper bound.
    # The fourth has no report yet and the fixed jobs keep theirs: their 60 s stands.
    _settle_unchanged(store, [j.id for j in adaptive[:3]] + [fixed[0].id], 3)
    states = store.states([j.id for j in adaptive])
    assert [s.recrawl_interval_ms if s else None for s in states] == [600_000] * 3 + [None]
    load = planner.demand(store, fresh=True).loads["site.example"]
    assert load.jobs == 6
    assert load.intervals == Counter({600.0: 3, 60.0: 3})
    assert load.demand == pytest.approx(3 * DAY_S / 600 + 3 * DAY_S / 60)
    # The Job form of the same rule (what a reader holding the job calls).
    assert demanded_interval(adaptive[0], states[0]) == 600
    assert demanded_interval(adaptive[3], states[3]) == 60


def test_the_scan_is_shared_until_it_is_due_again(make_store: Make) -> None:
    store = make_store(pacing=True, planner_refresh_s=3600)
    _fleet(store, "a.example", 2, 60)
    first = planner.demand(store)
    _fleet(store, "b.example", 2, 60)
    # Another process, inside the refresh period: the same result, no scan.
    other = Store(store.client, store.settings)
    assert planner.demand(other).computed_ms == first.computed_ms
    assert "b.example" in planner.demand(other, fresh=True).loads
    # Due again, while a third process holds the scan: the last result, no second scan.
    due = make_store(pacing=True, key_prefix=store.settings.key_prefix, planner_refresh_s=0.001)
    assert due.planner_claim(60_000)
    assert planner.demand(due).computed_ms == planner.shared(due)[0].computed_ms  # type: ignore[union-attr]


# ------------------------------------------------------------- where it shows
@pytest.fixture
def prefix(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from cli_prefix(redis_url, monkeypatch, "plan", pacing=True, domain_delay_s=2.0)


def _oversubscribe(make_store: Make, prefix: str) -> Store:
    store = make_store(pacing=True, domain_delay_s=2.0, key_prefix=prefix)
    _fleet(store, "over.example", 60, 60)  # 86,400 a day asked, 43,200 allowed
    _fleet(store, "fine.example", 10, 3600)
    return store


def _table(result: Result) -> dict[str, dict[str, str]]:
    header, *rows = result.stdout.splitlines()
    starts = [i for i, ch in enumerate(header)
              if ch != " " and (i == 0 or header[i - 2:i] == "  ")]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    return {cells[0]: dict(zip(names, cells, strict=True)) for line in rows
            if (cells := [line[a:b].strip()
                          for a, b in zip(starts, [*starts[1:], None], strict=True)])}


def test_zsched_domains_flags_the_oversubscribed_domain(make_store: Make, prefix: str) -> None:
    _oversubscribe(make_store, prefix)
    result = invoke("domains")
    assert result.exit_code == 0, result.output
    rows = _table(result)
    assert rows["over.example"]["DEMAND/CAPACITY A DAY"] == "OVER 2.00x: 86.4k/43.2k"
    assert rows["over.example"]["LATENESS"] == "~1m"  # 60 s * (2 - 1)
    assert rows["over.example"]["DELAY FROM"] == "config"
    assert rows["fine.example"]["DEMAND/CAPACITY A DAY"] == "240/43.2k (1%)"
    assert rows["fine.example"]["LATENESS"] == "-"
    assert "planner: 1 over-subscribed of 2 domains with jobs (70 jobs" in result.stderr
    shown = {d["name"]: d for d in json.loads(invoke("domains", "--json").stdout)}
    assert shown["over.example"]["plan"] == {
        "jobs": 60, "demand_per_day": 86400.0, "capacity_per_day": 43200.0,
        "demand_ratio": 2.0, "lateness_s": 60.0, "oversubscribed": True}
    assert shown["over.example"]["delay_source"] == "config"


def test_an_override_changes_the_capacity_at_once(make_store: Make, prefix: str) -> None:
    _oversubscribe(make_store, prefix)
    invoke("domains")
    assert invoke("domains", "set", "over.example", "--delay", "0.5").exit_code == 0
    rows = _table(invoke("domains"))
    assert rows["over.example"]["DEMAND/CAPACITY A DAY"] == "86.4k/173k (50%)"
    assert rows["over.example"]["DELAY FROM"] == "override"


def _samples(store: Store) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_exporter_flags_the_oversubscribed_domain(make_store: Make, prefix: str) -> None:
    store = _oversubscribe(make_store, prefix)
    scanned = planner.demand(store)  # the exporter scans in the background: have one ready
    samples = _samples(store)
    sampled_ms = store.now_ms()
    assert samples[("zsched_domains_oversubscribed", ())] == 1
    assert samples[("zsched_domain_demand_ratio", (("domain", "over.example"),))] == 2.0
    assert samples[("zsched_domain_lateness_seconds", (("domain", "over.example"),))] == \
        pytest.approx(60.0, abs=0.01)
    assert samples[("zsched_domain_demand_ratio", (("domain", "fine.example"),))] == \
        pytest.approx(240 / 43_200)
    # The scan's age on Redis' clock: at most the time from the scan to the sample.
    assert 0 <= samples[("zsched_planner_age_seconds", ())] <= \
        (sampled_ms - scanned.computed_ms) / 1000


def test_the_exporter_scans_in_the_background_when_no_result_exists(make_store: Make) -> None:
    store = make_store(pacing=True, domain_delay_s=2.0)
    _fleet(store, "over.example", 60, 60)
    collector = StoreCollector(store)
    first = {m.name: m for m in collector.collect()}
    assert first["zsched_domains_oversubscribed"].samples[0].value == 0
    assert collector._planner is not None
    collector._planner.join(30)
    second = {m.name: m for m in collector.collect()}
    assert second["zsched_domains_oversubscribed"].samples[0].value == 1


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ZSCHED_"):
            monkeypatch.delenv(name)


def test_the_planner_benchmark_runs_small() -> None:
    """``benchmarks/planner.py`` end to end on a small fleet (its own redis-server)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    try:
        import planner as bench_planner
    finally:
        sys.path.pop(0)
    out = bench_planner.main(["--jobs", "2000", "--domains", "50", "--rounds", "1"])
    # 1% paused; every other job is an interval or cron job on one of the 50 domains.
    assert out["scanned_jobs"] == 1980 and out["domains_with_jobs"] == 50
    assert out["scan_s"]["min"] > 0 and out["stored_bytes"] > 0
