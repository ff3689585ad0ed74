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
from celery_zsched.store import Store, scripts
from celery_zsched.store.keys import partition_of
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


# ------------------------------------------------------------ placement rule
def _url_job(i: int) -> Job:
    return Job.from_dict({"id": f"u{i:03d}", "url": f"http://h{i % 23}.example/p/{i}",
                          "interval_s": 60, "jitter_s": 0})


def _busy_url_store(store: Store) -> list[Any]:
    """300 URL jobs over 23 domains and 20 without one: scheduled, paused, queued,
    running, dead. Returns the claimed occurrences (20 running, 20 queued)."""
    store.upsert_many([_url_job(i) for i in range(300)], stagger=True)
    store.upsert_many([_job(f"t{i}") for i in range(20)], stagger=False, static=True)
    store.pause(*[f"u{i:03d}" for i in range(0, 30)])
    now = store.now_ms()
    ids = sorted(records(store))
    for n, job_id in enumerate(ids):
        store.client.zadd(store.part_of(job_id).schedule, {job_id: now + 3_600_000 + n}, xx=True)
    for job_id in [f"u{i:03d}" for i in range(100, 140)]:
        store.client.zadd(store.part_of(job_id).schedule, {job_id: now}, xx=True)
    batch = store.claim(1000)
    assert len(batch.jobs) == 40
    for claimed in batch.jobs[:20]:
        assert store.start(claimed.job.id, claimed.occurrence, claimed.attempt).runs
    store.client.zadd(store.part_of("u200").dead, {"u200": now})
    return batch.jobs


def _placed_by_domain(store: Store) -> None:
    """Each paced job is in its domain's partition, and the directory names each one
    away from its id's own partition (and nothing else)."""
    count = store.partitions
    expected: dict[int, dict[str, str]] = {i: {} for i in range(count)}
    for index, keys in enumerate(store.parts):
        for job_id, raw in store.client.hgetall(keys.defs).items():
            job = Job.from_json(raw)
            domain = job.pacing_domain(store.settings)
            home = partition_of(domain, count) if domain else partition_of(job_id, count)
            assert index == home, job_id
            if home != partition_of(job_id, count):
                expected[partition_of(job_id, count)][job_id] = str(home)
    for index, keys in enumerate(store.parts):
        assert store.client.hgetall(keys.directory) == expected[index]


def test_turning_pacing_on_and_off_moves_every_job_whole_to_and_from_its_domains_partition(
        make_store: Callable[..., Store]) -> None:
    store = make_store(partitions=4)
    claimed = _busy_url_store(store)
    before = records(store)
    paced_settings = dataclasses.replace(store.settings, pacing=True)
    report = repartition(store.client, paced_settings, 4, chunk=37)
    assert (report.source_layout, report.target_layout) == ("4", "4/domain")
    assert report.moved > 50
    paced = Store(store.client, paced_settings)
    assert records(paced) == before
    _placed_by_domain(paced)
    with pytest.raises(LayoutMismatch, match="paced jobs by domain"):
        Store(store.client, store.settings).stats()
    # Messages published before the move start and settle after it, found by id alone.
    for c in claimed[20:]:
        assert paced.start(c.job.id, c.occurrence, c.attempt).runs, c.job.id
    for c in claimed:
        assert paced.settle(c.job.id, c.occurrence, c.attempt, "complete").applied, c.job.id
    after_runs = records(paced)
    # Registrable domains are another rule: moving to it and back off keeps every record.
    grouped = dataclasses.replace(paced_settings, domain_registrable=True)
    assert repartition(store.client, grouped, 4).target_layout == "4/registrable"
    assert records(Store(store.client, grouped)) == after_runs
    assert repartition(store.client, store.settings, 4).target_layout == "4"
    plain = Store(store.client, store.settings)
    assert records(plain) == after_runs
    for index, keys in enumerate(plain.parts):
        assert not store.client.exists(keys.directory)
        for job_id in store.client.hkeys(keys.defs):
            assert partition_of(job_id, 4) == index


def test_an_interrupted_move_to_domain_placement_resumes_and_finishes_parked_moves(
        make_store: Callable[..., Store]) -> None:
    store = make_store(partitions=3)
    _busy_url_store(store)
    paced_settings = dataclasses.replace(store.settings, pacing=True)

    def crash(moved: int) -> None:
        if moved > 60:
            raise KeyboardInterrupt

    before = records(store)
    with pytest.raises(KeyboardInterrupt):
        repartition(store.client, paced_settings, 5, chunk=20, progress=crash)
    assert store.client.get(store.base.layout) == "moving:3:5/domain"
    with pytest.raises(RepartitionRefused, match="--to 5"):
        repartition(store.client, store.settings, 5)
    paced_settings = dataclasses.replace(paced_settings, partitions=5)
    repartition(store.client, paced_settings, 5)
    paced = Store(store.client, paced_settings)
    assert records(paced) == before
    _placed_by_domain(paced)
    # A writer died mid-move (job parked): the next repartition finishes it.
    job = Job.from_json(store.client.hget(paced.part_of("u150").defs, "u150"))
    src = paced.locate(["u150"])["u150"]
    paced._run([(scripts.RELOCATE, paced.parts[src], [("u150", (src + 1) % 5, "")],
                 {"operation": "take"})])
    assert "u150" not in records(paced)
    repartition(store.client, dataclasses.replace(paced_settings, domain_registrable=True), 5)
    grouped = Store(store.client, dataclasses.replace(paced_settings, domain_registrable=True))
    assert records(grouped)["u150"] == before["u150"] and job.id == "u150"
    assert not any(store.client.hlen(k.moving) for k in grouped.parts)
    _placed_by_domain(grouped)


def test_the_cli_command_moves_a_store_to_domain_placement_when_pacing_is_turned_on(
        make_store: Callable[..., Store], monkeypatch: pytest.MonkeyPatch) -> None:
    from celery.bin.celery import celery

    from celery_zsched.services.appstore import forget_app
    from tests import cli_app

    store = make_store(partitions=4)
    store.upsert_many([_url_job(i) for i in range(60)], stagger=False)
    before = records(store)
    for name, value in (("REDIS_URL", store.settings.redis_url),
                        ("KEY_PREFIX", store.settings.key_prefix), ("PARTITIONS", "4"),
                        ("PACING", "true")):
        monkeypatch.setenv(f"ZSCHED_{name}", value)
    forget_app(cli_app.app)
    result = CliRunner().invoke(celery, ["-A", "tests.cli_app", "zsched", "repartition",
                                         "--to", "4"], catch_exceptions=False)
    forget_app(cli_app.app)
    assert result.exit_code == 0, result.output
    assert "repartitioned 4 -> 4/domain" in result.output
    assert "zsched domains refresh" in result.output
    paced = Store(store.client, dataclasses.replace(store.settings, pacing=True))
    assert records(paced) == before
    _placed_by_domain(paced)
