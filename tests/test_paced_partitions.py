"""Pacing on a partitioned store (one real Redis; tests/e2e/cluster/ runs it on a Cluster).

A paced job lives in its domain's partition, so the claim, the start gate and
the domain's state share one slot; an id alone finds its job through the
directory in the id's own partition; a job whose domain changes moves whole;
an interrupted move resumes; and the layout record names the placement rule.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from celery_zsched.core.errors import JobNotFound, LayoutMismatch
from celery_zsched.core.job import Job
from celery_zsched.store import Store, scripts
from celery_zsched.store.keys import partition_of
from celery_zsched.store.moves import MoveDeferred

P = 12
Make = Callable[..., Store]


def _job(host: str, i: int, **extra: Any) -> Job:
    return Job.from_dict({"url": f"http://{host}/p/{i}", "interval_s": 3600, "jitter_s": 0,
                          **extra})


def _where(store: Store, job_id: str) -> list[int]:
    """Every partition whose definitions hold ``job_id``."""
    return [i for i, keys in enumerate(store.parts) if store.client.hexists(keys.defs, job_id)]


def _due_now(store: Store, ids: list[str]) -> None:
    now = store.now_ms()
    for job_id in ids:
        store.client.zadd(store.part_of(job_id).schedule, {job_id: now - 10}, xx=True)


def _run_all(store: Store, expected: int) -> dict[str, list[int]]:
    """Claim, start and complete until ``expected`` occurrences ran; the start times
    (Redis' clock) per domain."""
    starts: dict[str, list[int]] = defaultdict(list)
    ran = 0
    while ran < expected:
        batch = store.claim_parts({i: 100 for i in range(store.partitions)})
        for claimed in (c for b in batch.values() for c in b.jobs):
            store.learn_header(claimed.job.id, claimed.partition)
            while True:  # as a worker does: sit out the start gate's last moments
                result = store.start(claimed.job.id, claimed.occurrence, claimed.attempt,
                                     delivery=claimed.deliveries)
                if result.status != "wait":
                    break
                time.sleep((result.until_ms or 1) / 1000)
            assert result.status == "ok", result
            domain = claimed.job.pacing_domain(store.settings)
            assert domain is not None and result.now_ms is not None
            starts[domain].append(result.now_ms)
            store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "complete",
                         fence=result.fence)
            ran += 1
    return starts


def test_a_paced_job_lives_in_its_domains_partition_and_its_id_alone_finds_it(
        make_store: Make) -> None:
    store = make_store(partitions=P, pacing=True)
    paced = [_job(f"h{d}.example", i) for d in range(8) for i in range(6)]
    plain = [Job.from_dict({"id": f"task-{i}", "task": "tests.noop", "interval_s": 60})
             for i in range(6)]
    report = store.upsert_many(paced + plain)
    assert report.created == len(paced) + len(plain)
    away = 0
    for job in paced:
        home = partition_of(job.pacing_domain(store.settings) or "", P)
        assert _where(store, job.id) == [home]
        entry = store.client.hget(store.parts[partition_of(job.id, P)].directory, job.id)
        assert entry == (None if home == partition_of(job.id, P) else str(home))
        away += entry is not None
    assert away > len(paced) // 2  # most ids hash elsewhere than their domain
    for job in plain:
        assert _where(store, job.id) == [partition_of(job.id, P)]
    # Every operation that knows only the id finds the job.
    target = next(j for j in paced if partition_of(j.id, P) != store.locate([j.id])[j.id])
    assert store.get(target.id).job.url == target.url
    assert store.pause(target.id) == 1 and not store.get(target.id).job.enabled
    assert store.resume(target.id) == 1 and store.run_now(target.id) == 1
    assert [i.job.id for i in store.get_many([target.id, plain[0].id]) if i] == [
        target.id, plain[0].id]
    # A delete removes the job, then its directory entry.
    assert store.delete(target.id) == 1
    assert _where(store, target.id) == []
    assert not store.client.hexists(store.parts[partition_of(target.id, P)].directory,
                                    target.id)
    with pytest.raises(JobNotFound):
        store.get(target.id)


def test_jobs_of_one_domain_in_every_partition_never_start_closer_than_its_delay(
        make_store: Make) -> None:
    """With the default delay and cap, across 12 partitions: by id the jobs of one
    domain would sit in many partitions, each with a gate of its own."""
    store = make_store(partitions=P, pacing=True)
    jobs = [_job(f"s{d}.example", i) for d in range(5) for i in range(3)]
    store.upsert_many(jobs)
    assert len({p for j in jobs for p in [partition_of(j.id, P)]}) > 5
    _due_now(store, [j.id for j in jobs])
    starts = _run_all(store, len(jobs))
    delay = round(store.settings.domain_delay_s * 1000)
    for domain, times in starts.items():
        assert len(times) == 3, domain
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert min(gaps) >= delay, (domain, gaps)


def test_a_changed_domain_moves_the_job_whole_and_waits_while_it_is_in_flight(
        make_store: Make) -> None:
    store = make_store(partitions=P, pacing=True, domain_delay_s=0)
    hosts = [f"m{i}.example" for i in range(40)]
    first = hosts[0]
    other = next(h for h in hosts if partition_of(h, P) != partition_of(first, P))
    job = _job(first, 1, id="mover")
    store.upsert(job)
    _due_now(store, [job.id])
    _run_all(store, 1)
    before = store.get(job.id)
    assert before.state.runs == 1
    moved = _job(other, 1, id="mover")
    store.upsert(moved)
    assert _where(store, job.id) == [partition_of(other, P)]
    after = store.get(job.id)
    assert after.job.url == moved.url and after.state.runs == 1
    assert after.next_run_ms == before.next_run_ms
    assert not any(store.client.hlen(k.moving) for k in store.parts)
    # In flight: the change waits, nothing moves, the definition stays.
    _due_now(store, [job.id])
    [claimed] = [c for b in store.claim_parts({i: 10 for i in range(P)}).values()
                 for c in b.jobs]
    third = next(h for h in hosts if partition_of(h, P) not in
                 (partition_of(other, P), partition_of(first, P)))
    with pytest.raises(MoveDeferred, match="mover"):
        store.upsert(_job(third, 1, id="mover"))
    assert store.upsert_many([_job(third, 1, id="mover")]).deferred == 1
    assert _where(store, job.id) == [partition_of(other, P)]
    assert store.get(job.id).job.url == moved.url
    result = store.start(job.id, claimed.occurrence, claimed.attempt,
                         delivery=claimed.deliveries)
    assert result.status == "ok"
    assert store.settle(job.id, claimed.occurrence, claimed.attempt, "complete",
                        fence=result.fence).applied
    store.upsert(_job(third, 1, id="mover"))
    assert _where(store, job.id) == [partition_of(third, P)]
    assert store.get(job.id).state.runs == 2


def test_an_interrupted_move_reads_as_absent_then_resumes_with_nothing_lost_or_doubled(
        make_store: Make) -> None:
    store = make_store(partitions=P, pacing=True)
    hosts = [f"c{i}.example" for i in range(40)]
    src_host = hosts[0]
    dst_host = next(h for h in hosts if partition_of(h, P) != partition_of(src_host, P))
    src, dst = partition_of(src_host, P), partition_of(dst_host, P)
    job = _job(src_host, 1, id="crashy")
    store.upsert(job)
    due = store.get(job.id).next_run_ms
    # A writer dies right after step 1 (taken out, parked): nothing claims it, no
    # reader sees half of it.
    store._run([(scripts.RELOCATE, store.parts[src], [(job.id, dst, "")],
                 {"operation": "take"})])
    assert _where(store, job.id) == []
    with pytest.raises(JobNotFound):
        store.get(job.id)
    _due_now(store, [job.id])
    assert not any(b.jobs for b in store.claim_parts({i: 10 for i in range(P)}).values())
    # ... and after step 2 (the directory names the new partition, which is empty).
    store.client.hset(store.parts[partition_of(job.id, P)].directory, job.id, str(dst))
    with pytest.raises(JobNotFound):
        store.get(job.id)
    # The next write of any job puts it back where its stored definition belongs
    # (the new one was never written: its writer died unanswered and writes again).
    store.upsert(_job("unrelated.example", 1))
    assert _where(store, job.id) == [src]
    assert store.get(job.id).next_run_ms == due
    store.upsert(_job(dst_host, 1, id="crashy"))
    assert _where(store, job.id) == [dst] and store.get(job.id).next_run_ms == due
    assert not any(store.client.hlen(k.moving) for k in store.parts)
    assert store.resume_moves() == 0


def test_a_directory_entry_without_its_job_reads_as_absent_and_a_write_corrects_it(
        make_store: Make) -> None:
    store = make_store(partitions=P, pacing=True)
    job = _job("d.example", 1, id="ghost")
    home = partition_of("d.example", P)
    wrong = (home + 1) % P
    store.client.hset(store.parts[partition_of(job.id, P)].directory, job.id, str(wrong))
    with pytest.raises(JobNotFound):
        store.get(job.id)
    assert store.upsert(job).created == 1
    assert _where(store, job.id) == [home] and store.get(job.id).job.id == "ghost"


def test_the_layout_record_names_the_placement_rule_and_a_mismatched_process_refuses(
        make_store: Make) -> None:
    paced = make_store(partitions=4, pacing=True)
    paced.upsert(_job("a.example", 1))
    assert paced.client.get(paced.base.layout) == "4/domain"
    prefix = paced.settings.key_prefix
    for other in (make_store(partitions=4, key_prefix=prefix),
                  make_store(partitions=4, pacing=True, domain_registrable=True,
                             key_prefix=prefix)):
        with pytest.raises(LayoutMismatch, match="paced jobs by domain"):
            other.get_many(["x"])
    with pytest.raises(LayoutMismatch, match="has 4 partitions but zsched_partitions is 6"):
        make_store(partitions=6, pacing=True, key_prefix=prefix).get_many(["x"])


def test_a_messages_partition_header_spares_the_directory_and_a_foreign_one_is_ignored(
        make_store: Make) -> None:
    store = make_store(partitions=P, pacing=True)
    job = next(j for j in (_job("h.example", i) for i in range(50))
               if partition_of(j.id, P) != partition_of("h.example", P))
    store.upsert(job)
    _due_now(store, [job.id])
    [claimed] = [c for b in store.claim_parts({i: 10 for i in range(P)}).values()
                 for c in b.jobs]
    header = claimed.headers()["zsched_partition"]
    assert header == f"{partition_of('h.example', P)}@{P}/domain"
    worker = make_store(partitions=P, pacing=True, key_prefix=store.settings.key_prefix)
    worker.learn_header(job.id, f"{(partition_of('h.example', P) + 1) % P}@6/domain")
    assert worker.locate([job.id])[job.id] == partition_of("h.example", P)
    # Without its directory entry, only the header can find the job.
    store.client.delete(*(k.directory for k in store.parts))
    worker.learn_header(job.id, header)
    result = worker.start(job.id, claimed.occurrence, claimed.attempt,
                          delivery=claimed.deliveries)
    assert result.status == "ok"
    assert worker.settle(job.id, claimed.occurrence, claimed.attempt, "complete",
                         fence=result.fence).applied
