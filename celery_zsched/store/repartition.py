"""Change a store's layout: ``celery -A proj zsched repartition --to P``.

The layout is the partition count and the placement rule (:mod:`.placement`):
by id, or, with pacing on, a paced job in its domain's partition. Turning
pacing on or off, or changing ``zsched_domain_registrable``, changes the rule,
and this command moves the jobs for it too (with the new settings, ``--to``
the same count).

It is an offline operation: beat and workers must be stopped first, because a
process routes each job by the partition count it started with. The command
checks that none is alive (beats announce themselves, workers heartbeat), marks
the store as moving (any process that starts meanwhile waits instead of
touching it), moves each job whose partition changes, then records the new
count. Every job is copied whole (definition, runtime state, due time, queued
or running deadline, paused, dead letter, static flag) before its old copy is
deleted, so an interruption loses nothing: running the command again resumes
and finishes the move, and a job is never in two partitions afterwards. The
tombstones of deleted jobs (versioned deletes) move to their new partitions too.
In-flight occurrences keep their occurrence and attempt, so their messages
start and settle in the new partition once the workers are back.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_zsched.config import Settings
from celery_zsched.core import stream_ids
from celery_zsched.core.errors import ZSchedError
from celery_zsched.store.keys import PARK_BASE, Keys, partition_of
from celery_zsched.store.placement import Layout

#: Zsets and sets that may hold a job id, besides the two hashes.
_SCORED = ("schedule", "http_schedule", "queued", "leases", "dead")
_MEMBERS = ("paused", "static")


class RepartitionRefused(ZSchedError):
    """Beat or workers are still alive, or another repartition is half done."""


@dataclass
class RepartitionReport:
    """What one repartition did."""

    source: int
    target: int
    moved: int = 0
    kept: int = 0
    seconds: float = 0.0
    #: The layouts before and after ("P", or "P/rule" when paced jobs go by domain).
    source_layout: str = ""
    target_layout: str = ""


def recorded_layout(client: Any, base: Keys) -> tuple[Layout, Layout | None]:
    """(the store's layout, target of an unfinished repartition or ``None``)."""
    recorded = client.get(base.layout)
    if recorded is None:
        return Layout(1), None
    text = str(recorded)
    if text.startswith("moving:"):
        _, old, new = text.split(":")
        return Layout.parse(old), Layout.parse(new)
    return Layout.parse(text), None


def recorded_partitions(client: Any, base: Keys) -> tuple[int, int | None]:
    """(partitions the store has, target count of an unfinished repartition or ``None``)."""
    source, pending = recorded_layout(client, base)
    return source.count, None if pending is None else pending.count


def live_processes(client: Any, base: Keys, count: int, alive_ms: int) -> list[str]:
    """Beats and workers that announced themselves within ``alive_ms``."""
    now_s, now_us = client.time()
    since = int(now_s) * 1000 + int(now_us) // 1000 - alive_ms
    pipe = client.pipeline(transaction=False)
    pipe.zrangebyscore(base.beats, since, "+inf")
    for keys in base.partitions(count):
        pipe.zrangebyscore(keys.workers, since, "+inf")
    found: set[str] = set()
    for members in pipe.execute():
        # q:<queue> entries record consumed queues, not processes.
        found.update(str(m) for m in members if not str(m).startswith("q:"))
    return sorted(found)


def repartition(client: Any, settings: Settings, to: int, *, force: bool = False,
                chunk: int = 1000, progress: Callable[[int], None] | None = None
                ) -> RepartitionReport:
    """Move the store under ``settings.key_prefix`` to ``to`` partitions, placed by the
    rule ``settings`` ask for (see module doc)."""
    if to < 1:
        raise ValueError(f"--to must be >= 1, got {to}")
    started = time.perf_counter()
    base = Keys.for_prefix(settings.key_prefix)
    layout, pending = recorded_layout(client, base)
    goal = Layout.of(dataclasses.replace(settings, partitions=to))
    if pending is not None and pending != goal:
        raise RepartitionRefused(
            f"a repartition from {layout} to {pending} partitions was interrupted: "
            f"finish it first with `zsched repartition --to {pending.count}` (and the "
            "pacing settings it started with)")
    source = layout.count
    report = RepartitionReport(source, to, source_layout=str(layout), target_layout=str(goal))
    if layout == goal and pending is None:
        return report
    alive_ms = int(settings.heartbeat_s * 3000)
    _refuse_if_alive(client, base, source, alive_ms, force)
    client.set(base.layout, f"moving:{layout}:{goal}")
    # A process that read the layout just before it changed announces itself
    # right after: look once more, now that none can start unnoticed.
    time.sleep(0.2)
    try:
        _refuse_if_alive(client, base, source, alive_ms, force)
    except RepartitionRefused:
        if pending is None:
            client.set(base.layout, str(layout))
        raise
    old, new = base.partitions(source), base.partitions(to)
    for keys in old:
        _unpark(client, base, keys, goal)
        _move_partition(client, base, keys, layout, goal, chunk, report, progress)
        _move_tombstones(client, base, keys, to)
    for keys in new:
        _recount(client, keys)
    new_prefixes = {keys.prefix for keys in new}
    for keys in old:
        if keys.prefix not in new_prefixes:
            # The audit trail first: _retire deletes every key of the partition.
            _retire_audit(client, keys, new[0], settings.audit_maxlen)
            _retire(client, keys, new[0], settings.events_maxlen)
    _rebuild_directory(client, base, old, goal, chunk)
    client.set(base.layout, str(goal))
    report.seconds = time.perf_counter() - started
    return report


def _recount(client: Any, keys: Keys) -> None:
    """Rebuild a partition's per-queue backpressure counts from what it now holds.

    Jobs moved in bring their queued occurrences and held-back jobs along, but not
    their counts: each queued occurrence counts again under its state's queue, and
    every held-back job becomes plainly due (the next claim holds it back again if
    its queue is still at its bound).
    """
    ids = [str(i) for i in client.zrange(keys.queued, 0, -1)]
    tally: dict[str, int] = {}
    for raw in (client.hmget(keys.state, ids) if ids else []):
        queue = json.loads(raw).get("bq") if raw else None
        if isinstance(queue, str):
            tally[queue] = tally.get(queue, 0) + 1
    held = client.zrangebyscore(keys.schedule, PARK_BASE, "+inf", withscores=True)
    pipe = client.pipeline(transaction=True)
    pipe.delete(keys.queue_in_flight, keys.queue_held)
    if tally:
        pipe.hset(keys.queue_in_flight, mapping=tally)
    if held:
        pipe.zadd(keys.schedule, {str(i): score - PARK_BASE for i, score in held})
    pipe.execute()


def _refuse_if_alive(client: Any, base: Keys, count: int, alive_ms: int, force: bool) -> None:
    alive = live_processes(client, base, count, alive_ms)
    if alive and not force:
        raise RepartitionRefused(
            "stop beat and workers first; still alive: " + ", ".join(alive[:10])
            + (f" and {len(alive) - 10} more" if len(alive) > 10 else "")
            + " (--force if they are gone but did not shut down cleanly)")


def _move_partition(client: Any, base: Keys, src: Keys, source: Layout, goal: Layout,
                    chunk: int, report: RepartitionReport,
                    progress: Callable[[int], None] | None) -> None:
    cursor = 0
    while True:
        cursor, found = client.hscan(src.defs, cursor, count=chunk)
        moving: dict[str, Keys] = {}
        for job_id, raw in found.items():
            job_id, raw = str(job_id), str(raw)
            dst = base.partition(goal.home_of(job_id, raw), goal.count)
            if dst.prefix != src.prefix:
                moving[job_id] = dst
            elif base.partition(source.home_of(job_id, raw), source.count).prefix == src.prefix:
                report.kept += 1  # (not one that an earlier partition moved in here)
        if moving:
            _copy(client, src, moving)
            _drop(client, src, list(moving))
            report.moved += len(moving)
            if progress:
                progress(report.moved)
        if not cursor:
            return


def _unpark(client: Any, base: Keys, src: Keys, goal: Layout) -> None:
    """Finish the online moves a crash interrupted (records parked in ``moving``, see
    relocate.lua): each job goes whole to its home in the new layout."""
    for job_id, raw in client.hgetall(src.moving).items():
        rec = json.loads(raw)
        dst = base.partition(goal.home_of(str(job_id), rec["def"]), goal.count)
        if not client.hexists(dst.defs, job_id):
            pipe = client.pipeline(transaction=False)
            pipe.hset(dst.defs, job_id, rec["def"])
            if rec["st"]:
                pipe.hset(dst.state, job_id, rec["st"])
            for name, field in (("schedule", "sch"), ("http_schedule", "http"),
                                ("dead", "dead")):
                if rec[field]:
                    pipe.zadd(getattr(dst, name), {job_id: float(rec[field])})
            for name in _MEMBERS:
                if rec[name] == 1:
                    pipe.sadd(getattr(dst, name), job_id)
            pipe.execute()
        client.hdel(src.moving, job_id)


def _rebuild_directory(client: Any, base: Keys, old: list[Keys], goal: Layout,
                       chunk: int) -> None:
    """The directory of the new layout: an entry for each job away from its id's own
    partition (the old entries go first; the store is offline, nobody reads them)."""
    new = base.partitions(goal.count)
    client.delete(*{keys.directory for keys in [*old, *new]})
    if not goal.by_domain:
        return
    for index, keys in enumerate(new):
        cursor = 0
        while True:
            cursor, found = client.hscan(keys.defs, cursor, count=chunk)
            pipe = client.pipeline(transaction=False)
            for job_id in map(str, found):
                own = partition_of(job_id, goal.count)
                if own != index:
                    pipe.hset(new[own].directory, job_id, str(index))
            pipe.execute()
            if not cursor:
                break


def _move_tombstones(client: Any, base: Keys, src: Keys, to: int) -> None:
    """Carry the tombstones of deleted jobs (versioned deletes) to their new partitions.

    There are no more than the deletes of ``zsched_tombstone_ttl_s``; each is
    copied before its old copy goes, like a job.
    """
    expiry = {str(k): v for k, v in client.zrange(src.tombstone_expiry, 0, -1,
                                                   withscores=True)}
    pipe = client.pipeline(transaction=False)
    for job_id, version in client.hscan_iter(src.tombstones):
        dst = base.partition(partition_of(str(job_id), to), to)
        if dst.prefix == src.prefix:
            continue
        pipe.hset(dst.tombstones, job_id, version)
        pipe.zadd(dst.tombstone_expiry, {job_id: expiry.get(str(job_id), 0)})
        pipe.hdel(src.tombstones, job_id)
        pipe.zrem(src.tombstone_expiry, job_id)
    pipe.execute()


def _copy(client: Any, src: Keys, moving: dict[str, Keys]) -> None:
    """Write each job's whole record into its new partition (overwriting a half copy)."""
    ids = list(moving)
    pipe = client.pipeline(transaction=False)
    pipe.hmget(src.defs, ids)
    pipe.hmget(src.state, ids)
    for name in _SCORED:
        pipe.zmscore(getattr(src, name), ids)
    for name in _MEMBERS:
        pipe.smismember(getattr(src, name), ids)
    defs, states, *rest = pipe.execute()
    scores = dict(zip(_SCORED, rest[:len(_SCORED)], strict=True))
    members = dict(zip(_MEMBERS, rest[len(_SCORED):], strict=True))
    pipe = client.pipeline(transaction=False)
    for i, job_id in enumerate(ids):
        dst = moving[job_id]
        if defs[i] is None:  # deleted between the scan and now: nothing to carry
            continue
        pipe.hset(dst.defs, job_id, defs[i])
        if states[i] is not None:
            pipe.hset(dst.state, job_id, states[i])
        for name in _SCORED:
            if scores[name][i] is not None:
                pipe.zadd(getattr(dst, name), {job_id: scores[name][i]})
        for name in _MEMBERS:
            if members[name][i]:
                pipe.sadd(getattr(dst, name), job_id)
    pipe.execute()


def _drop(client: Any, src: Keys, ids: list[str]) -> None:
    pipe = client.pipeline(transaction=False)
    pipe.hdel(src.defs, *ids)
    pipe.hdel(src.state, *ids)
    for name in _SCORED:
        pipe.zrem(getattr(src, name), *ids)
    for name in _MEMBERS:
        pipe.srem(getattr(src, name), *ids)
    pipe.execute()


def _retire_audit(client: Any, old: Keys, heir: Keys, maxlen: int) -> None:
    """Append a retired partition's audit trail to ``heir``'s stream.

    The copies get new entry ids, so each keeps its time in ``at``; those the
    Django change history already holds are marked ``drained``, and its drain
    skips them. Entries move as they are copied: a resumed run copies none twice.
    """
    cursor = str(client.get(old.audit_cursor) or "0")
    while maxlen > 0:
        rows = client.xrange(old.audit, count=1000)
        if not rows:
            break
        pipe = client.pipeline(transaction=False)
        for sid, fields in rows:
            extra = {"at": fields.get("at") or str(stream_ids.millis(str(sid)))}
            if stream_ids.order(str(sid)) <= stream_ids.order(cursor):
                extra["drained"] = "1"
            pipe.xadd(heir.audit, {**fields, **extra}, maxlen=maxlen, approximate=True)
        pipe.xdel(old.audit, *(sid for sid, _ in rows))
        pipe.execute()


def _retire(client: Any, old: Keys, heir: Keys, events_maxlen: int) -> None:
    """Hand a partition the new layout no longer has over to ``heir``, then delete it.

    Lifetime counters are added to the heir's; settle events not yet copied into
    run history are appended to the heir's stream (with new entry ids).
    """
    for name, value in client.hgetall(old.counters).items():
        client.hincrby(heir.counters, name, int(value))
    client.delete(old.counters)
    cursor = str(client.get(old.drain_cursor) or "0")
    while True:
        rows = client.xrange(old.events, min=f"({cursor}" if cursor != "0" else "-", count=1000)
        if not rows:
            break
        pipe = client.pipeline(transaction=False)
        for _sid, fields in rows:
            pipe.xadd(heir.events, fields, maxlen=events_maxlen, approximate=True)
        pipe.execute()
        cursor = str(rows[-1][0])
        # Advance the old cursor as entries move, so a resumed run copies none twice.
        client.set(old.drain_cursor, cursor)
    client.delete(*old.all())
