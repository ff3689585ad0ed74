"""Versioned writes (the Django outbox's pushes), proven on ``upsert.lua`` and ``control.lua``
against the throwaway Redis.

A write that carries a version applies unless Redis holds a newer one of the job
(its state's ``v``) or of its delete (a tombstone): pushes that arrive out of
order, retries and late writes never move a definition back or bring a deleted
job back. Writes without a version (CLI, REST store writer, ``beat_schedule``)
keep working as before. Every test but the one on expiry runs with the default
settings.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from celery_zsched.core.audit import Actor
from celery_zsched.core.job import Job
from celery_zsched.core.state import RuntimeState
from celery_zsched.store import Store, audit_log
from tests.helpers import store_snapshot


def _job(job_id: str = "v1", **fields: Any) -> Job:
    data: dict[str, Any] = {"id": job_id, "task": "tests.noop", "interval_s": 60, "jitter_s": 0}
    data.update(fields)
    return Job.from_dict(data)


def _version(store: Store, job_id: str) -> int | None:
    raw = store.client.hget(store.part_of(job_id).state, job_id)
    return RuntimeState.from_wire(raw).version if raw else None


def _actions(store: Store, job_id: str) -> list[str]:
    return [c.action for c in reversed(audit_log.history(store, job_id, limit=100))]


def test_an_older_version_never_replaces_a_newer_definition(store: Store) -> None:
    assert store.upsert(_job(interval_s=60), version=5).created == 1
    report = store.upsert(_job(interval_s=30), version=3)
    assert (report.stale, report.updated, report.created) == (1, 0, 0)
    assert store.get("v1").job.interval_s == 60
    assert _version(store, "v1") == 5
    assert store.upsert(_job(interval_s=90), version=7).updated == 1
    assert store.get("v1").job.interval_s == 90
    assert _version(store, "v1") == 7
    # The refused write recorded nothing: one create, one edit.
    assert _actions(store, "v1") == ["create", "edit"]


def test_the_same_version_again_is_a_replay_that_changes_and_records_nothing(
        store: Store) -> None:
    # A retry of a push whose reply was lost: the same change at the same version.
    store.upsert(_job(), version=5)
    before = store_snapshot(store)
    report = store.upsert(_job(), version=5)
    assert (report.stale, report.rescheduled) == (0, 0)
    assert store_snapshot(store) == before
    store.control("pause", ["v1"], versions={"v1": 6})
    before = store_snapshot(store)
    assert store.control("pause", ["v1"], versions={"v1": 6}).changed == 0
    assert store_snapshot(store) == before
    assert _actions(store, "v1") == ["create", "pause"]


def test_a_versioned_delete_leaves_a_tombstone_that_refuses_older_writes(store: Store) -> None:
    store.upsert(_job(), version=5)
    reply = store.control("delete", ["v1"], versions={"v1": 6})
    assert (reply.changed, reply.stale, reply.missing) == (1, 0, ())
    now = store.now_ms()
    k = store.keys
    assert store.client.hget(k.tombstones, "v1") == "6"
    # Kept for the default zsched_tombstone_ttl_s (a day), on Redis' clock.
    expires = store.client.zscore(k.tombstone_expiry, "v1")
    assert expires is not None and now + 86_400_000 - 5_000 <= expires <= now + 86_400_000
    # A push of the definition before the delete, arriving late: refused.
    assert store.upsert(_job(interval_s=30), version=5).stale == 1
    assert store.control("pause", ["v1"], versions={"v1": 5}).stale == 1
    assert store.get_many(["v1"]) == [None]
    assert not store.client.zscore(k.schedule, "v1")
    assert _actions(store, "v1") == ["create", "delete"]


def test_a_newer_write_after_a_delete_creates_the_job_again_and_drops_the_tombstone(
        store: Store) -> None:
    store.upsert(_job(), version=5)
    store.control("delete", ["v1"], versions={"v1": 6})
    assert store.upsert(_job(interval_s=120), version=7).created == 1
    info = store.get("v1")
    assert info.job.interval_s == 120 and info.due_ms is not None
    k = store.keys
    assert store.client.hlen(k.tombstones) == 0 and store.client.zcard(k.tombstone_expiry) == 0
    assert _version(store, "v1") == 7


def test_a_versioned_delete_of_a_job_redis_never_had_still_leaves_a_tombstone(
        store: Store) -> None:
    # Created and deleted while Redis was down: only the delete is pushed, and the
    # create's push, were it to come late, must not create the job.
    reply = store.control("delete", ["ghost"], versions={"ghost": 4})
    assert (reply.changed, reply.missing) == (0, ("ghost",))
    assert store.upsert(_job("ghost"), version=3).stale == 1
    assert store.get_many(["ghost"]) == [None]
    assert store.upsert(_job("ghost"), version=5).created == 1


def test_a_tombstone_expires_after_its_ttl_on_the_redis_clock(
        make_store: Callable[..., Store]) -> None:
    # The one test with a shortened setting: it proves expiry, not the default's length.
    store = make_store(tombstone_ttl_s=0.2)
    store.upsert(_job(), version=5)
    store.control("delete", ["v1"], versions={"v1": 6})
    store.upsert(_job("other"), version=1)
    store.control("delete", ["other"], versions={"other": 2})
    deadline = store.now_ms() + 300
    while store.now_ms() < deadline:
        time.sleep(0.05)
    # Expired: the tombstone no longer refuses an older write (and is dropped).
    assert store.upsert(_job(), version=5).created == 1
    assert store.client.hget(store.keys.tombstones, "v1") is None
    # The next delete call prunes the other expired tombstone.
    store.control("delete", ["nothing"], versions={"nothing": 1})
    assert store.client.hget(store.keys.tombstones, "other") is None
    assert store.client.zscore(store.keys.tombstone_expiry, "other") is None


def test_unversioned_writes_keep_working_beside_versioned_ones(store: Store) -> None:
    store.upsert(_job(interval_s=60), version=5)
    # The CLI (or the REST API's store writer) edits it without a version.
    assert store.upsert(_job(interval_s=45), by=Actor.cli()).updated == 1
    assert store.get("v1").job.interval_s == 45
    assert _version(store, "v1") == 5  # left as it was
    assert store.upsert(_job(interval_s=30), version=4).stale == 1
    assert store.upsert(_job(interval_s=30), version=6).updated == 1
    # beat_schedule entries (static) and unversioned controls and deletes.
    assert store.upsert(_job("static", interval_s=10), static=True).created == 1
    assert store.pause("static") == 1 and store.resume("static") == 1
    assert store.delete("static") == 1
    assert store.client.hlen(store.keys.tombstones) == 0
    assert store.upsert(_job("static", interval_s=10), static=True).created == 1


def test_versioned_pause_and_resume_refuse_older_versions(store: Store) -> None:
    store.upsert(_job(), version=5)
    assert store.control("pause", ["v1"], versions={"v1": 6}).changed == 1
    assert store.control("resume", ["v1"], versions={"v1": 5}).stale == 1
    assert store.get("v1").paused
    assert store.control("resume", ["v1"], versions={"v1": 7}).changed == 1
    info = store.get("v1")
    assert not info.paused and info.due_ms is not None
    assert _version(store, "v1") == 7


def test_a_deleted_job_in_flight_is_not_brought_back_by_a_late_upsert(store: Store) -> None:
    store.upsert(_job(), version=5)
    claimed = store.claim().jobs[0]
    store.control("delete", ["v1"], versions={"v1": 6})
    assert store.upsert(_job(interval_s=30), version=5).stale == 1
    result = store.settle("v1", claimed.occurrence, claimed.attempt, "complete")
    assert result.status == "deleted"
    assert store.get_many(["v1"]) == [None]
    assert not store.client.hexists(store.keys.state, "v1")


def test_shuffled_pushes_of_many_jobs_end_with_each_jobs_newest_definition(
        make_store: Callable[..., Store]) -> None:
    store = make_store(partitions=3)
    rng = random.Random(19)
    pushes = [(f"j{n}", version) for n in range(60) for version in range(1, 6)]
    rng.shuffle(pushes)
    for job_id, version in pushes:
        if version == 5 and job_id.endswith("7"):
            store.control("delete", [job_id], versions={job_id: version})
        else:
            store.upsert(_job(job_id, interval_s=10 * version), version=version)
    infos = store.get_many([f"j{n}" for n in range(60)])
    for n, info in enumerate(infos):
        if str(n).endswith("7"):
            assert info is None, n
        else:
            assert info is not None and info.job.interval_s == 50, (n, info)


def test_repartition_carries_tombstones_to_the_deleted_jobs_new_partitions(
        make_store: Callable[..., Store]) -> None:
    from celery_zsched.store.repartition import repartition

    one = make_store()
    ids = [f"gone{n}" for n in range(12)]
    for job_id in ids:
        one.upsert(_job(job_id), version=5)
    one.control("delete", ids, versions=dict.fromkeys(ids, 6))
    repartition(one.client, one.settings, 3)
    three = Store(one.client, replace(one.settings, partitions=3))
    for job_id in ids:
        keys = three.part_of(job_id)
        assert three.client.hget(keys.tombstones, job_id) == "6", job_id
        assert three.client.zscore(keys.tombstone_expiry, job_id) is not None
    assert three.upsert_many([_job(job_id) for job_id in ids],
                             versions=dict.fromkeys(ids, 5)).stale == 12
    assert three.get_many(ids) == [None] * 12
