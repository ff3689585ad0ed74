"""Resume, edits and the paused state never make a job run early or change it silently.

Issue 8, part 3: a job resumed or re-timed right after a run waits out its
interval from that run; the paused state is one fact that export, import and
the CLI agree on, so an export -> import round trip changes nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery_zsched.core.job import Job
from celery_zsched.store import ReapResult, Store
from tests.helpers import store_snapshot
from tests.test_cli import Run, prefix, run, zstore  # noqa: F401  (fixtures)


def _job(job_id: str = "r1", **fields: Any) -> Job:
    data: dict[str, Any] = {"id": job_id, "task": "tests.noop", "interval_s": 300, "jitter_s": 0}
    data.update(fields)
    return Job.from_dict(data)


def _run_and_settle(store: Store, job: Job) -> int:
    """Store ``job``, run it once (claim, start, complete); returns the settle time."""
    store.upsert(job)
    store.client.zadd(store.keys.schedule, {job.id: store.now_ms() - 1}, xx=True)
    claimed = store.claim().jobs[0]
    assert store.start(job.id, claimed.occurrence, claimed.attempt).runs
    res = store.settle(job.id, claimed.occurrence, claimed.attempt, "complete")
    assert res.applied and res.now_ms is not None
    return res.now_ms


def _due(store: Store, job_id: str) -> float | None:
    return store.client.zscore(store.keys.schedule, job_id)


def test_an_interval_job_resumed_right_after_a_run_waits_out_its_interval(store: Store) -> None:
    """Pause and resume right after a run: due at last run + interval, not now."""
    ran_at = _run_and_settle(store, _job())
    store.pause("r1")
    assert store.resume("r1") == 1
    assert _due(store, "r1") == ran_at + 300_000
    assert store.claim().jobs == []


def test_a_resumed_interval_job_whose_interval_has_passed_runs_now_plus_jitter(
        make_store: Callable[..., Store]) -> None:
    """When last run + interval is in the past, resume makes it due now (plus jitter only)."""
    store = make_store()
    _run_and_settle(store, _job(interval_s=0.2, jitter_s=5))
    store.pause("r1")
    time.sleep(0.3)
    store.resume("r1")
    due, now = _due(store, "r1"), store.now_ms()
    assert due is not None and now - 50 <= due <= now + 5_000


def test_a_job_that_never_ran_resumes_by_the_first_run_rule(store: Store) -> None:
    """No last run: resume follows the first-run rule (now + jitter; cron: next slot)."""
    store.upsert(_job("never", enabled=False))
    store.upsert(_job("cron", interval_s=None, cron="0 12 * * *", enabled=False))
    store.resume("never", "cron")
    now = store.now_ms()
    due = _due(store, "never")
    assert due is not None and abs(due - now) < 1000
    cron_due = _due(store, "cron")
    assert cron_due is not None and cron_due > now and int(cron_due) % 3_600_000 == 0


def test_a_cron_job_resumes_at_its_next_slot_after_now(store: Store) -> None:
    """A cron job that ran resumes at its next slot, never at once."""
    _run_and_settle(store, _job("c", interval_s=None, cron="*/5 * * * *"))
    store.pause("c")
    store.resume("c")
    due, now = _due(store, "c"), store.now_ms()
    assert due is not None and now < due <= now + 300_000 and int(due) % 300_000 == 0


def test_a_dead_lettered_job_resumes_no_earlier_than_last_run_plus_interval(
        make_store: Callable[..., Store]) -> None:
    """Resuming a dead letter follows the same rule as resuming a paused job."""
    store = make_store(lease_s=0.05, max_deliveries=1)
    ran_at = _run_and_settle(store, _job())
    store.client.zadd(store.keys.schedule, {"r1": store.now_ms() - 1}, xx=True)
    claimed = store.claim().jobs[0]
    assert store.start("r1", claimed.occurrence, claimed.attempt).runs
    time.sleep(0.08)
    assert store.reap() == ReapResult(dead=1, ids=("r1",), dead_ids=("r1",))
    assert store.resume("r1") == 1
    assert store.get("r1").status == "scheduled"
    assert _due(store, "r1") == ran_at + 300_000


def test_an_interval_edit_right_after_a_run_reschedules_from_that_run(store: Store) -> None:
    """20 s -> 3600 s just after a run: due at last run + 3600 s, not at once."""
    ran_at = _run_and_settle(store, _job(interval_s=20))
    report = store.upsert(_job(interval_s=3600))
    assert report.rescheduled == 1
    assert _due(store, "r1") == ran_at + 3_600_000


def test_enabling_a_paused_job_by_import_waits_out_its_interval(store: Store) -> None:
    """An import that flips enabled back on is a resume, with the same floor."""
    ran_at = _run_and_settle(store, _job())
    store.upsert(_job(enabled=False))
    assert store.upsert(_job()).rescheduled == 1
    assert _due(store, "r1") == ran_at + 300_000


def test_paused_state_is_read_from_one_place(store: Store) -> None:
    """pause/resume and enabled=false imports agree in get() and in the export scan."""
    store.upsert(_job("added-paused", enabled=False))
    store.upsert(_job("paused-later"))
    store.resume("added-paused")
    store.pause("paused-later")
    assert store.get("added-paused").job.enabled and not store.get("added-paused").paused
    assert not store.get("paused-later").job.enabled and store.get("paused-later").paused
    exported = {job.id: job.enabled for job in store.iter_jobs()}
    assert exported == {"added-paused": True, "paused-later": False}


def _export_import(run: Run, tmp_path: Path, store: Store) -> tuple[Any, Any]:  # noqa: F811
    out = tmp_path / "jobs.json"
    assert run("export", "--file", str(out)).exit_code == 0
    before = store_snapshot(store)
    result = run("import", "--file", str(out))
    assert result.exit_code == 0, result.output
    return before, store_snapshot(store)


def test_export_import_round_trip_of_paused_resumed_and_dead_jobs_changes_nothing(
        run: Run, zstore: Store, tmp_path: Path) -> None:  # noqa: F811
    """CLI: add --paused then resume, pause, and a dead letter; export -> import is a no-op."""
    assert run("add", "--id", "a", "--task", "t", "--interval", "300", "--paused").exit_code == 0
    assert run("resume", "a").exit_code == 0
    assert run("add", "--id", "b", "--task", "t", "--interval", "300").exit_code == 0
    assert run("pause", "b").exit_code == 0
    assert run("add", "--id", "c", "--task", "t", "--interval", "300").exit_code == 0
    state = json.loads(zstore.client.hget(zstore.keys.state, "c") or "{}")
    zstore.client.zrem(zstore.keys.schedule, "c")
    zstore.client.zadd(zstore.keys.dead, {"c": zstore.now_ms()})
    zstore.client.hset(zstore.keys.state, "c", json.dumps({**state, "s": "dead"}))

    listing = tmp_path / "listing.json"
    assert run("export", "--file", str(listing)).exit_code == 0
    rows = {r["id"]: r for r in json.loads(listing.read_text())}
    assert rows["a"].get("enabled", True) is True
    assert rows["b"]["enabled"] is False
    assert rows["c"].get("enabled", True) is True
    before, after = _export_import(run, tmp_path, zstore)
    for key in ("schedule", "paused", "dead", "queued", "leases"):
        assert after[key] == before[key], key
    # The snapshots decode the state JSON (key order is cjson's): compare the values.
    assert after["state"] == before["state"]
    assert zstore.get("a").status == "scheduled" and not zstore.get("a").paused
    assert zstore.get("b").paused and zstore.get("c").status == "dead"
