"""``zsched repartition --to P`` on a real Redis: every job keeps its whole record
(definition, runtime state, due time, queued or running deadline, paused, dead
letter, static flag), nothing is lost or doubled, an interrupted run resumes,
and it refuses while beat or workers are alive."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from celery_zsched.config import Settings
from celery_zsched.core.errors import LayoutMismatch
from celery_zsched.core.job import Job
from celery_zsched.store import Store
from celery_zsched.store.repartition import RepartitionRefused, repartition


def _job(job_id: str) -> Job:
    return Job.from_dict({"id": job_id, "task": "tests.noop", "interval_s": 60, "jitter_s": 0})


def records(store: Store) -> dict[str, tuple[Any, ...]]:
    """Job id -> everything stored about it, from whichever partition holds it.

    Fails if any job is held by two partitions.
    """
    out: dict[str, tuple[Any, ...]] = {}
    c = store.client
    for keys in store.parts:
        defs = c.hgetall(keys.defs)
        for job_id, raw in defs.items():
            assert job_id not in out, f"{job_id} is in two partitions"
            out[job_id] = (
                raw, c.hget(keys.state, job_id), c.zscore(keys.schedule, job_id),
                c.zscore(keys.queued, job_id), c.zscore(keys.leases, job_id),
                c.sismember(keys.paused, job_id), c.zscore(keys.dead, job_id),
                c.sismember(keys.static, job_id))
    return out


def _with(settings: Settings, partitions: int) -> Settings:
    return dataclasses.replace(settings, partitions=partitions)


def _busy_store(store: Store) -> None:
    """600 jobs in every state: scheduled, paused, static, queued, running, settled, dead."""
    store.upsert_many([_job(f"j{i:03d}") for i in range(560)], stagger=True)
    store.upsert_many([_job(f"s{i}") for i in range(40)], stagger=False, static=True)
    store.pause(*[f"j{i:03d}" for i in range(0, 50)])
    now = store.now_ms()
    for n, job_id in enumerate(sorted(records(store))):  # nothing due but the 60 below
        store.client.zadd(store.part_of(job_id).schedule, {job_id: now + 3_600_000 + n}, xx=True)
    due = [f"j{i:03d}" for i in range(100, 160)]
    for job_id in due:
        store.client.zadd(store.part_of(job_id).schedule, {job_id: now}, xx=True)
    batch = store.claim(1000)
    assert len(batch.jobs) == 60
    for claimed in batch.jobs[:20]:  # 20 running, 20 settled, 20 left queued
        assert store.start(claimed.job.id, claimed.occurrence, claimed.attempt).runs
    for claimed in batch.jobs[20:40]:
        store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "error", error="boom")
    for job_id in ("j500", "j501"):
        store.client.zadd(store.part_of(job_id).dead, {job_id: now})


@pytest.mark.parametrize("path", [(1, 4), (4, 3), (3, 1)], ids=["1to4", "4to3", "3to1"])
def test_repartition_moves_every_record_whole(
        make_store: Callable[..., Store], path: tuple[int, int]) -> None:
    source, target = path
    store = make_store(partitions=source)
    _busy_store(store)
    before, stats = records(store), store.stats()
    report = repartition(store.client, store.settings, target, chunk=97)
    assert (report.source, report.target) == (source, target)
    assert report.moved + report.kept == 600 and report.moved > 0
    moved = Store(store.client, _with(store.settings, target))
    assert records(moved) == before
    after = moved.stats()
    for name in ("jobs", "scheduled", "queued", "running", "paused", "dead", "total_promoted",
                 "total_error"):
        assert after.get(name) == stats.get(name), name
    assert moved.static_ids() == {f"s{i}" for i in range(40)}
    # Keys of partitions the new layout does not have are gone.
    new_prefixes = {k.prefix for k in moved.parts}
    for keys in store.parts:
        if keys.prefix not in new_prefixes:
            assert store.client.exists(*keys.all()) == 0
    # The old count is now refused, the new one accepted.
    with pytest.raises(LayoutMismatch):
        Store(store.client, store.settings).stats()


def test_in_flight_occurrences_start_and_settle_after_the_move(
        make_store: Callable[..., Store]) -> None:
    store = make_store()
    store.upsert_many([_job(f"f{i}") for i in range(30)], stagger=False)
    now = store.now_ms()
    for i in range(30):
        store.client.zadd(store.keys.schedule, {f"f{i}": now}, xx=True)
    batch = store.claim(100)
    running = batch.jobs[:10]
    for c in running:
        store.start(c.job.id, c.occurrence, c.attempt)
    repartition(store.client, store.settings, 5)
    moved = Store(store.client, _with(store.settings, 5))
    # Messages published before the move start (queued ones) and settle (all) after it.
    for c in batch.jobs[10:]:
        assert moved.start(c.job.id, c.occurrence, c.attempt).runs, c.job.id
    for c in batch.jobs:
        assert moved.settle(c.job.id, c.occurrence, c.attempt, "complete").applied, c.job.id
    assert moved.stats()["scheduled"] == 30


def test_an_interrupted_repartition_resumes_and_processes_wait_meanwhile(
        make_store: Callable[..., Store]) -> None:
    store = make_store(partitions=2)
    _busy_store(store)
    before = records(store)

    def crash(moved: int) -> None:
        if moved > 150:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        repartition(store.client, store.settings, 6, chunk=50, progress=crash)
    assert store.client.get(store.base.layout) == "moving:2:6"
    for count in (2, 6):  # neither layout may be used while a move is half done
        with pytest.raises(LayoutMismatch, match="being repartitioned from 2 to 6"):
            Store(store.client, _with(store.settings, count)).stats()
    with pytest.raises(RepartitionRefused, match="--to 6"):
        repartition(store.client, store.settings, 3)
    report = repartition(store.client, store.settings, 6)
    assert report.source == 2 and report.target == 6
    assert records(Store(store.client, _with(store.settings, 6))) == before


def test_refused_while_beat_or_workers_are_alive(make_store: Callable[..., Store]) -> None:
    store = make_store()
    store.upsert(_job("x1"))
    store.heartbeat([], worker="celery@host1", queues=["celery"])
    with pytest.raises(RepartitionRefused, match="celery@host1"):
        repartition(store.client, store.settings, 4)
    assert store.client.get(store.base.layout) in (None, "1")  # nothing changed
    store.forget_worker("celery@host1")
    store.announce("beat@host2:77")
    with pytest.raises(RepartitionRefused, match="beat@host2:77"):
        repartition(store.client, store.settings, 4)
    assert repartition(store.client, store.settings, 4, force=True).moved == 1
    store.announce("beat@host2:77", gone=True)
    assert repartition(store.client, store.settings, 1).moved == 1
    assert Store(store.client, store.settings).get("x1").job.id == "x1"


def test_the_cli_command_moves_the_store_and_says_what_to_do_next(
        make_store: Callable[..., Store], monkeypatch: pytest.MonkeyPatch) -> None:
    from celery.bin.celery import celery

    from celery_zsched.services.appstore import forget_app
    from tests import cli_app

    store = make_store()
    store.upsert_many([_job(f"c{i}") for i in range(50)], stagger=False)
    monkeypatch.setenv("ZSCHED_REDIS_URL", store.settings.redis_url)
    monkeypatch.setenv("ZSCHED_KEY_PREFIX", store.settings.key_prefix)
    forget_app(cli_app.app)
    result = CliRunner().invoke(celery, ["-A", "tests.cli_app", "zsched", "repartition",
                                         "--to", "3"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "repartitioned 1 -> 3: moved 50 job(s)" in result.output
    assert "set zsched_partitions=3" in result.output
    Store(store.client, _with(store.settings, 3)).heartbeat([], worker="celery@busy")
    monkeypatch.setenv("ZSCHED_PARTITIONS", "3")
    result = CliRunner().invoke(celery, ["-A", "tests.cli_app", "zsched", "repartition",
                                         "--to", "1"])
    assert result.exit_code == 75, result.output
    assert "stop beat and workers first" in result.output
    assert len(records(Store(store.client, _with(store.settings, 3)))) == 50
    forget_app(cli_app.app)
