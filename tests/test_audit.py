"""The audit trail in Redis: every change of a job is one entry, written by the
script that makes the change, with the diff against what it replaced."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from celery_zsched.core import audit
from celery_zsched.core.audit import Actor, Change
from celery_zsched.core.errors import ValidationError
from celery_zsched.core.job import Job
from celery_zsched.services.importer import import_file
from celery_zsched.store import Store, audit_log
from celery_zsched.store.repartition import repartition
from tests.dead_letters import dead_job, kill

ALICE = Actor("cli", "alice@ops")


def job(job_id: str = "j1", **fields: object) -> Job:
    return Job.from_dict({"id": job_id, "url": f"https://example.com/{job_id}",
                          "interval_s": 300, **fields})


def entries(store: Store) -> list[Change]:
    return [Change.from_entry(sid, fields) for part in range(store.partitions)
            for sid, fields in audit_log.entries(store, part=part)]


def test_create_records_the_definition_and_actor(store: Store) -> None:
    store.upsert(job(name="first"), by=ALICE, note="new target")
    [change] = audit_log.history(store, "j1")
    assert (change.action, change.actor, change.note) == ("create", ALICE, "new target")
    assert change.diff["name"] == [None, "first"]
    assert change.diff["interval_s"] == [None, 300]
    assert "id" not in change.diff  # the job's own id is no field of its diff
    assert abs(change.at_ms - store.now_ms()) < 5000


def test_edit_records_exactly_the_changed_fields(store: Store) -> None:
    store.upsert(job(name="first", meta={"a": 1, "b": [1, 2]}, jitter_s=5))
    store.upsert(job(name="second", meta={"a": 1, "b": [1, 3]}, interval_s=60),
                 by=Actor("import", "rows.csv"))
    change = audit_log.history(store, "j1")[0]
    assert change.action == "edit"
    assert change.actor == Actor("import", "rows.csv")
    # jitter_s left out of the new definition: back to its default (None).
    assert change.diff == {"interval_s": [300, 60], "jitter_s": [5, None],
                           "meta": [{"a": 1, "b": [1, 2]}, {"a": 1, "b": [1, 3]}],
                           "name": ["first", "second"]}


def test_an_unchanged_upsert_records_nothing(store: Store) -> None:
    store.upsert(job())
    store.upsert(job())
    store.upsert_many([job()], by=Actor("import"))
    assert [c.action for c in entries(store)] == ["create"]


def test_reenabling_a_paused_job_by_upsert_is_an_edit_of_enabled(store: Store) -> None:
    store.upsert(job())
    store.pause("j1", by=ALICE, note="target down")
    store.upsert(job(), by=Actor("reconcile"))
    edit, pause, _create = audit_log.history(store, "j1")
    assert (pause.action, pause.diff, pause.note) == (
        "pause", {"enabled": [True, False]}, "target down")
    assert (edit.action, edit.actor.kind, edit.diff) == (
        "edit", "reconcile", {"enabled": [False, True]})


def test_state_operations_are_recorded_only_when_they_change_something(store: Store) -> None:
    store.upsert(job())
    store.pause("j1", by=ALICE, note="maintenance")
    store.pause("j1", by=ALICE)  # already paused: no change, no record
    store.resume("j1", by=ALICE, note="back")
    store.run_now("j1", by=ALICE)
    store.reset_failures("j1", by=ALICE)
    store.delete("j1", by=ALICE, note="gone for good")
    changes = audit_log.history(store, "j1")
    assert [c.action for c in changes] == [
        "delete", "reset", "run_now", "resume", "pause", "create"]
    delete, _reset, run_now, resume, *_ = changes
    assert resume.diff == {"enabled": [False, True]} and resume.note == "back"
    assert run_now.diff == {}
    assert delete.note == "gone for good"
    assert delete.diff["url"] == ["https://example.com/j1", None]
    assert all(c.actor == ALICE for c in changes[:-1])
    assert changes[-1].actor == audit.API


def test_requeue_and_purge_of_dead_letters_are_recorded(
        make_store: Callable[..., Store]) -> None:
    store = make_store(lease_s=0.05, max_deliveries=1)
    kill(store, [dead_job("d1"), dead_job("d2")])
    store.requeue_dead("d1", by=ALICE, note="fixed upstream")
    store.purge_dead("d2", by=ALICE)
    [requeue] = [c for c in audit_log.history(store, "d1") if c.action == "requeue"]
    [purge] = [c for c in audit_log.history(store, "d2") if c.action == "purge"]
    assert (requeue.actor, requeue.note) == (ALICE, "fixed upstream")
    assert purge.diff == {"enabled": [True, False]}


@pytest.mark.parametrize("partitions", [1, 3])
def test_history_reads_one_jobs_changes_across_pages(
        make_store: Callable[..., Store], partitions: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(partitions=partitions)
    monkeypatch.setattr(audit_log, "SCAN_PAGE", 7)
    store.upsert_many([job(f"j{i}") for i in range(40)])
    for n in range(5):
        store.upsert(job("j3", name=f"v{n}"))
    changes = audit_log.history(store, "j3", limit=4)
    assert [c.diff["name"][1] for c in changes] == ["v4", "v3", "v2", "v1"]
    assert len(audit_log.history(store, "j3", limit=100)) == 6


def test_the_stream_is_capped(make_store: Callable[..., Store]) -> None:
    store = make_store(audit_maxlen=100, import_chunk=50)
    store.upsert_many([job(f"j{i}") for i in range(2000)])
    length = store.client.xlen(store.keys.audit)
    # MAXLEN ~ trims whole macro nodes (100 entries each by default).
    assert 100 <= length <= 300


def test_audit_maxlen_0_records_nothing(make_store: Callable[..., Store]) -> None:
    store = make_store(audit_maxlen=0)
    store.upsert(job())
    store.pause("j1")
    assert store.client.exists(store.keys.audit) == 0


def test_a_file_import_records_each_created_job_and_a_reimport_nothing(
        store: Store, tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"id": f"j{i}", "url": f"https://example.com/{i}",
                                 "interval_s": 60} for i in range(300)]))
    import_file(store, path)
    again, _ = import_file(store, path)
    assert again.updated == 300
    recorded = entries(store)
    assert len(recorded) == 300
    assert {(c.action, c.actor) for c in recorded} == {
        ("create", Actor("import", f"{audit.local_user()}:rows.json"))}


def test_bad_actor_and_note_are_refused_naming_the_field(store: Store) -> None:
    with pytest.raises(ValidationError, match="actor kind: must be one of admin, cli"):
        Actor("robot")
    with pytest.raises(ValidationError, match="note: must be at most 1000 characters"):
        store.upsert(job(), note="x" * (audit.NOTE_MAX + 1))
    assert store.get_many(["j1"]) == [None]


def test_repartition_keeps_every_jobs_trail_and_its_times(
        make_store: Callable[..., Store]) -> None:
    store = make_store(partitions=3)
    store.upsert_many([job(f"j{i}") for i in range(30)], by=ALICE)
    store.pause("j1", by=ALICE, note="before the move")
    before = {f"j{i}": [(c.action, c.at_ms, c.note) for c in audit_log.history(store, f"j{i}")]
              for i in range(30)}
    repartition(store.client, store.settings, 1)
    merged = Store(store.client, dataclasses.replace(store.settings, partitions=1))
    after = {f"j{i}": [(c.action, c.at_ms, c.note) for c in audit_log.history(merged, f"j{i}")]
             for i in range(30)}
    assert after == before
    assert store.client.exists(*(k.audit for k in store.parts[1:])) == 0
    merged.resume("j1", by=ALICE)
    assert [c.action for c in audit_log.history(merged, "j1")] == ["resume", "pause", "create"]
