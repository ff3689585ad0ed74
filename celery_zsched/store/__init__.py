"""The Redis job store: every operation is one Lua script or one pipeline."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import heapq
import itertools
import json
import math
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from celery_zsched.config import Settings
from celery_zsched.core import stream_ids
from celery_zsched.core.audit import Actor, audit_args
from celery_zsched.core.domains import DomainInfo, domain_sort_key, info_from, normalise_domain
from celery_zsched.core.errors import JobNotFound, LayoutMismatch
from celery_zsched.core.job import Defaults, Job, definition_tag
from celery_zsched.core.results import (
    TASK_ID_NAMESPACE,
    ClaimBatch,
    Claimed,
    ImportReport,
    JobInfo,
    NoticeGate,
    OutboxReport,
    ReapResult,
    SettleResult,
    StartResult,
    merge_batches,
    task_id_for,
)
from celery_zsched.core.state import RuntimeState
from celery_zsched.core.timing import jitter_ms
from celery_zsched.store import scripts
from celery_zsched.store.connection import is_cluster, redis_client
from celery_zsched.store.errors import redis_unavailable
from celery_zsched.store.keys import Keys, partition_of
from celery_zsched.store.scripts import ControlReply, ScriptSpec

__all__ = [
    "TASK_ID_NAMESPACE", "ClaimBatch", "Claimed", "ImportReport", "JobInfo", "ReapResult",
    "SettleResult", "StartResult", "Store", "task_id_for",
]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

#: How far a settle event's times may lie from Redis' clock, and its spans run,
#: before they are dropped as nonsense (a worker's microseconds, a forged 10**30):
#: the run history must be able to convert every event it is given.
_TIMING_WINDOW_MS = 20 * 366 * 86_400_000  # 20 years
_EPOCH_FIELDS = ("due_ms", "promoted_ms", "started_ms", "finished_ms")
_SPAN_FIELDS = ("lateness_ms", "wait_ms", "duration_ms")


def _bounded_timings(event: Mapping[str, Any], now: int) -> dict[str, Any]:
    """``event`` with every time too far from ``now`` (Redis' clock) and every span
    too long set to ``None``."""
    def sane(value: Any, centre: int) -> bool:
        return (type(value) is int and abs(value - centre) <= _TIMING_WINDOW_MS)
    out = dict(event)
    for names, centre in ((_EPOCH_FIELDS, now), (_SPAN_FIELDS, 0)):
        for name in names:
            if out.get(name) is not None and not sane(out[name], centre):
                out[name] = None
    return out


#: Status label of a settle that does not retry.
_LABELS = {"complete": "complete", "skip": "skipped", "error": "error"}
#: Longest a worker sits out a closed domain gate at start before it hands the
#: occurrence back to the schedule instead (a prefork slot waits meanwhile).
START_WAIT_MAX_S = 2.0


def _unavailable(fn: Callable[P, R]) -> Callable[P, R]:
    """A store operation: Redis errors become ``StoreUnavailable``, and the
    store's partition layout is checked against the settings before the first one."""
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with redis_unavailable():
            store = args[0]
            assert isinstance(store, Store)
            if not store.layout_checked:
                store.check_layout()
            return fn(*args, **kwargs)
    return wrapper


#: An execution a worker keeps alive: (id, occurrence, attempt[, fence]).
Running = tuple[str, int, int] | tuple[str, int, int, int]
#: A message a worker received and holds: (id, occurrence, attempt, delivery, task).
Held = tuple[str, int, int, int, str]

#: A script call for :meth:`Store._run`: spec, partition keys, rows, named args.
Call = tuple["ScriptSpec[Any]", Keys, Sequence[Sequence[Any]], Mapping[str, Any]]


def _time_ms(reply: Sequence[Any]) -> int:
    """Epoch ms of a Redis ``TIME`` reply (seconds, microseconds)."""
    sec, usec = reply
    return int(sec) * 1000 + int(usec) // 1000


def _as_paused(job: Job, paused: bool) -> Job:
    """``job`` with ``enabled`` taken from the paused set: the one record of that fact.

    The stored definition keeps the ``enabled`` it was last written with, while
    pause and resume only change the set, so readers always derive it.
    """
    return job if job.enabled is not paused else dataclasses.replace(job, enabled=not paused)


@functools.lru_cache(maxsize=4096)
def _job_of(raw: str) -> Job:
    """The job of a definition JSON: a worker settles the same jobs again and again."""
    return Job.from_json(raw)


def _version(versions: Mapping[str, int | None] | None, job_id: str) -> str:
    """A script row's version field: "" for none (an unversioned write)."""
    version = versions.get(job_id) if versions else None
    return str(int(version)) if version else ""


def _first(row: Sequence[Any]) -> str:
    """The job id of a script row (always its first value)."""
    return str(row[0])


def _first_score(*scores: float | None) -> int | None:
    """The first score that is set, as int ms (a job is in at most one of the sets)."""
    return next((int(x) for x in scores if x is not None), None)


def _pooled_connection(pool: Any) -> Any:
    """A connection of ``pool``, on every redis-py this package admits."""
    try:
        return pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants a command name
        return pool.get_connection("EVALSHA")


class _ScriptStream:
    """Calls one script over one connection, sending a call before the previous reply is read.

    With at most two calls in flight, Redis executes one chunk of a bulk
    upsert while Python builds the next: the two overlap instead of taking
    turns. Replies come back in order. Clients without a single connection
    pool run each call synchronously instead; on Redis Cluster, each partition
    streams over the connection pool of the node that holds its slot.
    """

    def __init__(self, client: Any, script: Script, keys: Sequence[str]) -> None:
        self.script = script
        self.keys = list(keys)
        self.pool: Any = getattr(client, "connection_pool", None)
        if is_cluster(client):
            # The pool of the node that serves this partition's slot.
            node = client.get_node_from_key(self.keys[0])
            connection = node.redis_connection if node is not None else None
            self.pool = connection.connection_pool if connection is not None else None
        self.conn: Any = None
        self.in_flight: list[int] = []  # row counts of the calls awaiting their reply

    def __enter__(self) -> _ScriptStream:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.conn is not None:
            if self.in_flight:  # replies left unread: the connection cannot be reused
                self.conn.disconnect()
            self.pool.release(self.conn)
            self.conn = None

    def call(self, args: Sequence[Any], rows: int) -> list[tuple[int, Any]]:
        """Send one call; returns the (rows, reply) of calls that had to be read first."""
        if self.pool is None:
            return [(rows, self.script(keys=self.keys, args=list(args)))]
        if self.conn is None:
            self.conn = _pooled_connection(self.pool)
        # EVAL, not EVALSHA: no NOSCRIPT to recover from mid-stream. A health
        # check PING would read a pending reply, so only check an idle connection.
        self.conn.send_command("EVAL", self.script.script, len(self.keys), *self.keys, *args,
                               check_health=not self.in_flight)
        self.in_flight.append(rows)
        return self.drain(keep=1)

    def drain(self, keep: int = 0) -> list[tuple[int, Any]]:
        """Read replies until at most ``keep`` calls are in flight."""
        out = []
        while len(self.in_flight) > keep:
            reply = self.conn.read_response()
            out.append((self.in_flight.pop(0), reply))
        return out


class Store:
    """Job definitions and their timing state in Redis.

    Every time is read from the Redis server's clock (``TIME``), never the host's.
    Every method that changes jobs takes ``by`` (an :class:`~.audit.Actor`) and
    ``note``, and records each change in the audit trail (:mod:`.audit`).
    """

    def __init__(self, client: Any, settings: Settings | None = None,
                 timezone: str = "UTC") -> None:
        self.client = client
        self.settings = settings or Settings()
        #: Keys on the base prefix (the layout record lives there).
        self.base = Keys.for_prefix(self.settings.key_prefix)
        #: Each partition's keys; a job lives in ``parts[partition_of(id, P)]``.
        self.parts = self.base.partitions(self.settings.partitions)
        #: The first partition's keys (the only ones in a one-partition store).
        self.keys = self.parts[0]
        self.defaults = Defaults.from_settings(self.settings, timezone)
        self.rng = random.Random()
        self.layout_checked = False
        #: The partition the gateway's next claim starts at (see :meth:`claim_http`).
        self._http_cursor = 0
        #: What the pacing-aware scripts read: the settings as JSON, or "" (off).
        self.pacing = (self.settings.pacing_defaults.to_json()
                       if self.settings.pacing else "")
        self._scripts: dict[str, Script] = {
            name: client.register_script(scripts.source(name)) for name in scripts.SCRIPTS
        }

    @classmethod
    def from_settings(cls, settings: Settings, timezone: str = "UTC") -> Store:
        """A store on ``settings.redis_url`` (connects lazily, on first use)."""
        return cls(redis_client(settings), settings, timezone)

    # ----------------------------------------------------------------- basics
    @_unavailable
    def now_ms(self) -> int:
        """The Redis server's clock, in epoch ms."""
        return _time_ms(self.client.time())

    @property
    def partitions(self) -> int:
        """How many partitions this store has (``zsched_partitions``)."""
        return len(self.parts)

    def part_of(self, job_id: str) -> Keys:
        """The keys of the partition that holds ``job_id``."""
        return self.parts[partition_of(job_id, len(self.parts))]

    def group(self, items: Iterable[T], id_of: Callable[[T], str] = str
              ) -> dict[int, list[T]]:
        """``items`` by the partition index of their job id (``id_of(item)``), in
        their given order within each."""
        out: dict[int, list[T]] = defaultdict(list)
        for item in items:
            out[partition_of(id_of(item), len(self.parts))].append(item)
        return out

    def check_layout(self) -> None:
        """Raise :class:`LayoutMismatch` unless the store has ``zsched_partitions`` partitions.

        A store without a layout record has one partition, unless it is empty:
        a fresh store takes the configured count (recorded on first check).
        """
        configured = len(self.parts)
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.base.layout)
        pipe.hlen(self.base.defs)
        recorded, base_jobs = pipe.execute()
        if recorded is None:
            if configured == 1:
                self.layout_checked = True
                return
            if base_jobs:
                recorded = "1"
            else:
                self.client.set(self.base.layout, str(configured), nx=True)
                recorded = self.client.get(self.base.layout) or str(configured)
        recorded = str(recorded)
        if recorded.startswith("moving:"):
            _, old, new = recorded.split(":")
            raise LayoutMismatch(
                f"the store under {self.base.prefix} is being repartitioned from {old} to "
                f"{new} partitions (zsched repartition); waiting for it to finish")
        if int(recorded) != configured:
            raise LayoutMismatch(
                f"the store under {self.base.prefix} has {recorded} partitions but "
                f"zsched_partitions is {configured}: set zsched_partitions={recorded}, "
                f"or run `zsched repartition --to {configured}` with beat and workers stopped")
        self.layout_checked = True

    def _call(self, spec: ScriptSpec[R], keys: Keys, rows: Iterable[Sequence[Any]] = (),
              **args: Any) -> R:
        """Run ``spec`` on partition ``keys`` with its named ``args`` (and ``rows``); parse it."""
        return spec.reply(self._scripts[spec.name](keys=spec.key_names(keys),
                                                   args=spec.argv(args, rows)))

    def _call_hot(self, spec: ScriptSpec[R], keys: Keys, **args: Any) -> R:
        """:meth:`_call` for the worker's start and settle, once each per execution:
        straight on a pooled connection, without redis-py's per-command machinery
        (it costs about as much client CPU as the round trip itself). A Cluster
        client goes the usual way (it routes by slot and follows MOVED)."""
        pool = getattr(self.client, "connection_pool", None)
        if pool is None or is_cluster(self.client):
            return self._call(spec, keys, **args)
        script = self._scripts[spec.name]
        names = spec.key_names(keys)
        argv = spec.argv(args)
        conn = _pooled_connection(pool)
        try:
            conn.send_command("EVALSHA", script.sha, len(names), *names, *argv)
            try:
                reply = conn.read_response()
            except NoScriptError:  # a fresh or restarted server: load it, as Script does
                conn.send_command("EVAL", script.script, len(names), *names, *argv)
                reply = conn.read_response()
        except BaseException:
            conn.disconnect()  # a reply may be left unread: never reuse it
            raise
        finally:
            pool.release(conn)
        return spec.reply(reply)

    def _run(self, calls: Sequence[Call]) -> list[Any]:
        """Run several script calls in one pipeline (one round trip per Redis node).

        EVALSHA straight into the pipeline: no SCRIPT EXISTS round trip first.
        A node that does not know a script yet (a fresh or promoted one) answers
        NOSCRIPT without running it, so just those calls are run again, loading it.
        Replies are raw, in the order of ``calls``.
        """
        if len(calls) == 1:
            spec, keys, rows, args = calls[0]
            return [self._scripts[spec.name](keys=spec.key_names(keys),
                                             args=spec.argv(args, rows))]
        pipe = self.client.pipeline(transaction=False)
        cluster = is_cluster(self.client)
        for spec, keys, rows, args in calls:
            names = spec.key_names(keys)
            # execute_command, not pipe.evalsha(): redis-py's ClusterPipeline blocks
            # the evalsha method. On a Cluster, name the node of the partition's
            # slot: left to find the keys itself, the pipeline asks a node
            # COMMAND GETKEYS for every script call first, one round trip each.
            # (A MOVED reply after a failover is still followed.)
            options = {"target_nodes": self.client.get_node_from_key(names[0])} if cluster else {}
            pipe.execute_command("EVALSHA", self._scripts[spec.name].sha, len(names), *names,
                                 *spec.argv(args, rows), **options)
        replies = pipe.execute(raise_on_error=False)
        out = []
        for (spec, keys, rows, args), reply in zip(calls, replies, strict=True):
            if isinstance(reply, NoScriptError):
                reply = self._scripts[spec.name](keys=spec.key_names(keys),
                                                 args=spec.argv(args, rows))
            elif isinstance(reply, Exception):
                raise reply
            out.append(reply)
        return out

    def _pipeline_each(self, commands: Callable[[Any, Keys], None]) -> list[list[Any]]:
        """Queue ``commands(pipe, keys)`` for every partition; the replies, per partition."""
        pipe = self.client.pipeline(transaction=False)
        sizes = []
        for keys in self.parts:
            before = len(pipe)
            commands(pipe, keys)
            sizes.append(len(pipe) - before)
        replies = pipe.execute()
        out, at = [], 0
        for size in sizes:
            out.append(replies[at:at + size])
            at += size
        return out

    # ----------------------------------------------------------------- writes
    def upsert(self, job: Job, *, static: bool = False, by: Actor | None = None,
               note: str = "", expect: str = "", version: int | None = None) -> ImportReport:
        """Store one job. A new job first runs now (cron: its next slot).

        The change is recorded in the audit trail as made ``by`` (default: ``api``).
        ``expect`` makes the write conditional, checked atomically with it:
        ``"absent"`` (no job of this id yet: a create) or the :func:`definition_tag`
        of the definition it replaces (compare-and-set). When it does not hold,
        nothing is written and the report counts the job as ``skipped``.
        ``version``: see ``versions`` of :meth:`upsert_many`.
        """
        return self.upsert_many([job], stagger=False, static=static, by=by, note=note,
                                expect={job.id: expect} if expect else None,
                                versions={job.id: version} if version else None)

    @_unavailable
    def upsert_many(self, jobs: Iterable[Job], *, stagger: bool = True, static: bool = False,
                    total: int | None = None,
                    progress: Callable[[int], None] | None = None,
                    first_due: dict[str, int | None] | None = None,
                    by: Actor | None = None, note: str = "",
                    expect: Mapping[str, str] | None = None,
                    versions: Mapping[str, int] | None = None) -> ImportReport:
        """Store many jobs, pipelined in chunks; new jobs' first runs are staggered.

        Job ``i`` of ``total`` first runs at ``now + i/total * interval + jitter``,
        so an import spreads evenly over each job's interval. Jobs that already
        exist keep their schedule (ZADD NX) unless their timing changed.
        ``first_due`` (id -> epoch ms, ``None`` = never runs) overrides the first
        run of the jobs it names, e.g. to continue another scheduler's timeline.
        Each created or changed job is recorded in the audit trail as changed
        ``by`` (default: ``api``), with ``note``; an unchanged one records nothing.
        ``expect`` (id -> condition) makes the writes of the jobs it names
        conditional, as for :meth:`upsert`. ``versions`` (id -> a version that
        only grows, from the Django row) makes them versioned: a job whose stored
        version, or whose delete's tombstone, is newer is left alone and counted
        as ``stale``, so pushes that arrive out of order never move a definition
        back. Jobs without one are written whatever their stored version.
        """
        if total is None:
            jobs = list(jobs)
            total = len(jobs)
        started = time.perf_counter()
        now = self.now_ms()
        report = ImportReport(total=total)
        chunks: dict[int, list[tuple[str, ...]]] = defaultdict(list)
        flag = {"static": "1" if static else "0",
                **audit_args(self.settings.audit_maxlen, by, note)}
        done = 0
        upsert = scripts.UPSERT
        with contextlib.ExitStack() as stack:
            streams: dict[int, _ScriptStream] = {}

            def send(part: int, rows: list[tuple[str, ...]]) -> list[tuple[int, Any]]:
                if part not in streams:
                    streams[part] = stack.enter_context(_ScriptStream(
                        self.client, self._scripts[upsert.name],
                        upsert.key_names(self.parts[part])))
                return streams[part].call(upsert.argv(flag, rows), len(rows))

            for index, job in enumerate(jobs):
                phase = index / total if stagger and total else 0.0
                gap = ""
                if first_due is not None and job.id in first_due:
                    due = first_due[job.id]
                else:
                    due = job.first_due_ms(now, self.settings, self.rng, phase)
                    gap = self._gap_after_last_run(job)
                part = partition_of(job.id, len(self.parts))
                chunk = chunks[part]
                chunk.append((job.id, job.to_json(), "" if due is None else str(due),
                              "1" if job.enabled else "0", job.timing_signature, gap,
                              job.pacing_domain(self.settings) or "",
                              "h" if job.transport == "http" else "",
                              expect.get(job.id, "") if expect else "",
                              _version(versions, job.id)))
                if len(chunk) >= self.settings.import_chunk:
                    # Redis runs this chunk while the loop builds the next one.
                    for rows, result in send(part, chunk):
                        done = self._tally(upsert.reply(result), report, done + rows, progress)
                    chunks[part] = []
            replies = [reply for part, chunk in chunks.items() if chunk
                       for reply in send(part, chunk)]
            replies += [reply for stream in streams.values() for reply in stream.drain()]
            for rows, result in replies:
                done = self._tally(upsert.reply(result), report, done + rows, None)
        if progress:
            progress(done)
        report.seconds = time.perf_counter() - started
        return report

    def _gap_after_last_run(self, job: Job) -> str:
        """How long after its last run an interval job may run again (interval + jitter).

        A rescheduling edit or a resume never makes a job due earlier than this
        after its last run: a target is never hit more often than its interval.
        """
        if job.kind != "interval" or job.interval_s is None:
            return ""
        jitter = jitter_ms(job.effective_jitter_s(self.settings), self.rng)
        return str(round(job.interval_s * 1000) + jitter)

    @staticmethod
    def _tally(result: Sequence[int], report: ImportReport, done: int,
               progress: Callable[[int], None] | None) -> int:
        """Add one chunk's counts to ``report``; ``done`` rows are stored so far."""
        created, updated, rescheduled, skipped, stale = result
        report.skipped += skipped
        report.stale += stale
        report.created += created
        report.updated += updated
        report.rescheduled += rescheduled
        if progress:
            progress(done)
        return done

    @_unavailable
    def report_outbox(self, pending: int, dead: int, oldest_age_ms: int) -> int:
        """Record the Django outbox's counts for ``zsched exporter``; Redis' clock (ms)."""
        return self._call(scripts.OUTBOX_REPORT, self.base, pending=pending, dead=dead,
                          oldest_age_ms=oldest_age_ms)

    @_unavailable
    def outbox_report(self) -> OutboxReport:
        """The Django outbox as its sweeper last reported it, and Redis' clock (one round trip)."""
        # TIME has no key to route by: on a Cluster, send it to the node of the hash.
        options = ({"target_nodes": self.client.get_node_from_key(self.base.outbox)}
                   if is_cluster(self.client) else {})
        pipe = self.client.pipeline(transaction=False)
        pipe.execute_command("TIME", **options)
        pipe.hgetall(self.base.outbox)
        now, fields = pipe.execute()
        fields = fields or {}
        return OutboxReport(
            now_ms=_time_ms(now), pending=int(fields.get("pending") or 0),
            dead=int(fields.get("dead") or 0),
            oldest_age_ms=int(fields.get("oldest_age_ms") or 0),
            reported_ms=int(fields["at"]) if fields.get("at") else None)

    @_unavailable
    def static_ids(self) -> set[str]:
        """Ids of the jobs that came from ``beat_schedule``."""
        replies = self._pipeline_each(lambda pipe, keys: pipe.smembers(keys.static))
        return {str(m) for (members,) in replies for m in members}

    def _control(self, op: str, ids: Sequence[str], by: Actor | None, note: str,
                 dues: Sequence[int | str] | None = None,
                 versions: Mapping[str, int] | None = None) -> int:
        reply = self._control_all(op, ids, by, note, dues, versions)
        if reply.missing and len(ids) == 1:
            raise JobNotFound(reply.missing[0])
        return reply.changed

    def _control_all(self, op: str, ids: Sequence[str], by: Actor | None, note: str,
                     dues: Sequence[int | str] | None = None,
                     versions: Mapping[str, int] | None = None) -> ControlReply:
        by_part = self.group([(job_id, dues[i] if dues else 0, _version(versions, job_id))
                              for i, job_id in enumerate(ids)], _first)
        size = self.settings.import_chunk
        args = {"operation": op, **audit_args(self.settings.audit_maxlen, by, note),
                "tombstone_ms": round(self.settings.tombstone_ttl_s * 1000)}
        calls: list[Call] = [
            (scripts.CONTROL, self.parts[part], rows[start:start + size], args)
            for part, rows in by_part.items() for start in range(0, len(rows), size)]
        changed, stale = 0, 0
        missing: list[str] = []
        for result in self._run(calls) if calls else []:
            reply = scripts.CONTROL.reply(result)
            changed += reply.changed
            stale += reply.stale
            missing += reply.missing
        return ControlReply(changed, stale, tuple(missing))

    @_unavailable
    def control(self, op: str, ids: Sequence[str], *, versions: Mapping[str, int],
                by: Actor | None = None, note: str = "") -> ControlReply:
        """Versioned ``pause``, ``resume`` or ``delete`` of ``ids`` (the Django outbox).

        Each job's change applies only if Redis holds no newer version of it
        (``versions``: id -> version, from the row); a delete leaves a tombstone
        of its version for ``zsched_tombstone_ttl_s``, even for an id Redis never
        had, so an older upsert that arrives later cannot bring the job back.
        Never raises :class:`JobNotFound`: the reply names the ids not found.
        """
        if op not in ("pause", "resume", "delete"):
            raise ValueError(f"not a versioned operation: {op!r}")
        dues = self._resume_dues(ids) if op == "resume" else None
        return self._control_all(op, ids, by, note, dues, versions)

    @_unavailable
    def delete(self, *ids: str, by: Actor | None = None, note: str = "") -> int:
        """Delete jobs; an in-flight occurrence's settle will not bring them back."""
        return self._control("delete", ids, by, note)

    @_unavailable
    def pause(self, *ids: str, by: Actor | None = None, note: str = "") -> int:
        """Pause jobs; an in-flight occurrence still settles but is not rescheduled."""
        return self._control("pause", ids, by, note)

    @_unavailable
    def resume(self, *ids: str, by: Actor | None = None, note: str = "") -> int:
        """Resume paused (or dead-lettered) jobs; they never run earlier than they would have.

        An interval job runs at its last run + interval (or now, if that has
        passed), plus jitter; a cron job at its next slot after now; a job that
        never ran follows the first-run rule.
        """
        return self._control("resume", ids, by, note, self._resume_dues(ids))

    def _resume_dues(self, ids: Sequence[str]) -> list[int | str]:
        now = self.now_ms()
        dues: list[int | str] = []
        for info in self.get_many(ids):
            due = self._resume_due(info, now) if info else now
            # "" tells the script the job is over (its end_at has passed): it is
            # unpaused but finished, never run once more.
            dues.append("" if due is None else due)
        return dues

    def _resume_due(self, info: JobInfo, now: int) -> int | None:
        job, last = info.job, info.state.last_settled_ms
        start = now
        if job.kind == "interval" and job.interval_s is not None and last is not None:
            start = max(now, last + round(job.interval_s * 1000))
        return job.first_due_ms(start, self.settings, self.rng)

    @_unavailable
    def run_now(self, *ids: str, by: Actor | None = None, note: str = "") -> int:
        """Make jobs due now (jobs in flight are left alone)."""
        return self._control("run_now", ids, by, note)

    @_unavailable
    def reset_failures(self, *ids: str, by: Actor | None = None, note: str = "") -> int:
        """Zero failure counters; a dead-lettered job is brought back as due now."""
        return self._control("reset", ids, by, note)

    @_unavailable
    def requeue_dead(self, *ids: str, by: Actor | None = None, note: str = "") -> int:
        """Dead letters: unpaused and due now, counters reset (see :mod:`.dead`).

        Ids that are not dead letters (any more) are left alone and not counted.
        """
        return self._control("requeue", ids, by, note)

    @_unavailable
    def purge_dead(self, *ids: str, by: Actor | None = None, note: str = "") -> int:
        """Dead letters: dropped from the dead set; the jobs are kept, paused."""
        return self._control("purge", ids, by, note)

    # ------------------------------------------------------------------ reads
    @_unavailable
    def get(self, job_id: str) -> JobInfo:
        """One job with its state; raises :class:`JobNotFound`."""
        info = self.get_many([job_id])[0]
        if info is None:
            raise JobNotFound(job_id)
        return info

    @_unavailable
    def get_many(self, ids: Sequence[str]) -> list[JobInfo | None]:
        """Many jobs in one round trip of seven commands, ``None`` for ids that do not exist."""
        if not ids:
            return []
        # ZMSCORE/SMISMEMBER (Redis >= 6.2) keep this at seven commands per
        # partition however many ids a page or a bulk action asks for, all in
        # one pipeline (on a Cluster, one round trip per node, in parallel).
        groups = self.group(ids)
        pipe = self.client.pipeline(transaction=False)
        for part, members in groups.items():
            keys = self.parts[part]
            pipe.hmget(keys.defs, members)
            pipe.hmget(keys.state, members)
            pipe.zmscore(keys.schedule, members)
            pipe.zmscore(keys.http_schedule, members)
            pipe.zmscore(keys.leases, members)
            pipe.zmscore(keys.queued, members)
            pipe.smismember(keys.paused, members)
        replies = pipe.execute()
        found: dict[str, JobInfo] = {}
        for n, members in enumerate(groups.values()):
            defs, states, beat_dues, http_dues, leases, queued, paused = replies[7 * n:7 * n + 7]
            dues = [b if b is not None else h for b, h in zip(beat_dues, http_dues, strict=True)]
            for i, raw in enumerate(defs):
                if raw is None:
                    continue
                state = RuntimeState.from_wire(states[i])
                found[members[i]] = JobInfo(
                    job=_as_paused(Job.from_json(raw), bool(paused[i])),
                    status=state.status,
                    due_ms=int(dues[i]) if dues[i] is not None else None,
                    lease_until_ms=_first_score(leases[i], queued[i]),
                    paused=bool(paused[i]), state=state, tag=definition_tag(raw))
        return [found.get(job_id) for job_id in ids]

    @_unavailable
    def list_jobs(self, offset: int = 0, limit: int = 50) -> list[JobInfo]:
        """Scheduled jobs ordered by due time, one page.

        With partitions, each one's first ``offset + limit`` are merged: a deep
        page costs that many entries per partition.
        """
        end = offset + limit - 1

        def commands(pipe: Any, keys: Keys) -> None:
            pipe.zrange(keys.schedule, 0, end, withscores=True)
            pipe.zrange(keys.http_schedule, 0, end, withscores=True)

        replies = self._pipeline_each(commands)
        merged = heapq.merge(*(rows for part in replies for rows in part),
                             key=lambda row: (row[1], row[0]))
        ids = [str(job_id) for job_id, _ in list(merged)[offset:offset + limit]]
        return [info for info in self.get_many(ids) if info is not None]

    def iter_jobs(self, count: int = 1000) -> Iterator[Job]:
        """Every stored definition once (HSCAN: constant memory), for export and sync.

        ``enabled`` is read from the paused set, like everywhere else, so an
        export re-imports with the paused state it has now.
        Raises :class:`StoreUnavailable` if Redis goes away mid-scan.
        """
        # HSCAN may return an entry twice while the hash is rehashing; ids are
        # remembered so every job is yielded once (an id costs far less than a job).
        # A generator runs after the decorator returned, so it guards itself.
        with redis_unavailable():
            if not self.layout_checked:
                self.check_layout()
            for keys in self.parts:
                seen: set[str] = set()
                cursor = 0
                while True:
                    cursor, page = self.client.hscan(keys.defs, cursor, count=count)
                    assert isinstance(page, dict)  # HSCAN replies pairs; redis-py makes a dict
                    fresh = [(str(job_id), raw) for job_id, raw in page.items()
                             if job_id not in seen]
                    if fresh:
                        flags = self.client.smismember(keys.paused, [i for i, _ in fresh])
                        for (job_id, raw), paused in zip(fresh, flags, strict=True):
                            seen.add(job_id)
                            yield _as_paused(Job.from_json(raw), bool(paused))
                    if not cursor:
                        break

    @_unavailable
    def peek_next_due(self) -> int | None:
        """Due time of the earliest scheduled job (of any partition, either transport)."""
        def commands(pipe: Any, keys: Keys) -> None:
            pipe.zrange(keys.schedule, 0, 0, withscores=True)
            pipe.zrange(keys.http_schedule, 0, 0, withscores=True)

        replies = self._pipeline_each(commands)
        return min((int(first[0][1]) for part in replies for first in part if first),
                   default=None)

    @_unavailable
    def due_counts(self, edges: Sequence[int], *, http: bool = False) -> list[int]:
        """Scheduled jobs due before ``edges[0]``, then in each ``[edges[i], edges[i+1])``.

        ``len(edges)`` ZCOUNTs per partition, all in one pipeline: the cost
        depends on the number of edges (and ``log N``), never on a scan.
        ``http``: count the HTTP schedules' jobs too (twice the ZCOUNTs).
        """
        if not edges:
            return []
        zsets = ("schedule", "http_schedule") if http else ("schedule",)

        def commands(pipe: Any, keys: Keys) -> None:
            for name in zsets:
                zset = getattr(keys, name)
                pipe.zcount(zset, "-inf", f"({edges[0]}")
                for low, high in itertools.pairwise(edges):
                    pipe.zcount(zset, low, f"({high}")

        totals = [0] * len(edges)
        for reply in self._pipeline_each(commands):
            for index, value in enumerate(reply):
                totals[index % len(edges)] += int(value)
        return totals

    @_unavailable
    def stats(self) -> dict[str, int]:
        """Counts by state, jobs due soon, and lifetime counters."""
        now = self.now_ms()

        def commands(pipe: Any, keys: Keys) -> None:
            pipe.hlen(keys.defs)
            pipe.zcard(keys.schedule)
            pipe.zcard(keys.queued)
            pipe.zcard(keys.leases)
            pipe.scard(keys.paused)
            pipe.zcard(keys.dead)
            # HTTP jobs count like any job; http_scheduled says how many of them wait.
            for zset in (keys.schedule, keys.http_schedule):
                pipe.zcount(zset, "-inf", now)
                pipe.zcount(zset, "-inf", now + 60_000)
                pipe.zcount(zset, "-inf", now + 3_600_000)
            pipe.zcard(keys.http_schedule)
            pipe.hgetall(keys.counters)

        names = ("jobs", "scheduled", "queued", "running", "paused", "dead", "due_now",
                 "due_next_minute", "due_next_hour", "due_now", "due_next_minute",
                 "due_next_hour", "http_scheduled")
        counts = dict.fromkeys(names, 0)
        totals: dict[str, int] = defaultdict(int)
        for reply in self._pipeline_each(commands):
            for name, value in zip(names, reply[:-1], strict=True):
                counts[name] = counts.get(name, 0) + int(value)
            counts["scheduled"] += int(reply[-2])
            for k, v in reply[-1].items():
                totals[f"total_{k}"] += int(v)
        out = {"jobs": counts["jobs"], "scheduled": counts["scheduled"],
               "in_flight": counts["queued"] + counts["running"], **counts, **totals}
        if len(self.parts) > 1:
            out["partitions"] = len(self.parts)
        if self.settings.pacing:
            alerts = self.domain_alerts()
            out["domains_throttled"] = len(alerts["throttled"])
            out["breakers_open"] = len(alerts["breakers_open"])
        return out

    # ---------------------------------------------------------------- domains
    @_unavailable
    def domains(self) -> list[DomainInfo]:
        """Every domain with learned state or an override, sorted by name."""
        keys = self.keys
        state = dict(self.client.hscan_iter(keys.domains))
        conf = dict(self.client.hscan_iter(keys.domain_conf))
        now = self.now_ms()
        defaults = self.settings.pacing_defaults
        return [info_from(name, state.get(name), conf.get(name), defaults, now)
                for name in sorted(set(state) | set(conf), key=domain_sort_key)]

    @_unavailable
    def domain(self, name: str) -> DomainInfo:
        """One domain's pacing (the defaults for a domain never seen)."""
        name = normalise_domain(name)
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(self.keys.domains, name)
        pipe.hget(self.keys.domain_conf, name)
        pipe.time()
        state, conf, now = pipe.execute()
        return info_from(name, state, conf, self.settings.pacing_defaults, _time_ms(now))

    @_unavailable
    def set_domain(self, name: str, *, delay_s: float | None = None,
                   max_in_flight: int | None = None,
                   adaptive: bool | None = None) -> DomainInfo:
        """Override a domain's delay, cap or adaptivity (``None`` leaves one as it is)."""
        name = normalise_domain(name)
        changes: dict[str, Any] = {}
        if delay_s is not None:
            if not math.isfinite(delay_s) or delay_s < 0:
                raise ValueError(f"delay must be a number of seconds >= 0, got {delay_s!r}")
            changes["delay"] = round(delay_s * 1000)
        if max_in_flight is not None:
            if max_in_flight < 0:
                raise ValueError(f"max_in_flight must be >= 0 (0: no cap), got {max_in_flight!r}")
            changes["cap"] = int(max_in_flight)
        if adaptive is not None:
            changes["adaptive"] = bool(adaptive)
        if changes:
            self._call(scripts.DOMAIN, self.keys, operation="set", domain=name,
                       changes=json.dumps(changes))
        return self.domain(name)

    @_unavailable
    def reset_domain(self, name: str) -> bool:
        """Back to the defaults: drop the overrides and what was learned (in-flight
        accounting stays). ``False`` when the domain was not known."""
        return bool(self._call(scripts.DOMAIN, self.keys, operation="reset",
                               domain=normalise_domain(name), changes=""))

    def refresh_domains(self, progress: Callable[[int], None] | None = None) -> int:
        """Store every job again so its state names the domain it is paced under.

        A job learns its domain when it is stored; run this after turning
        ``zsched_pacing`` on (or changing ``zsched_domain_registrable``) for
        jobs stored before. Schedules do not move (re-storing is idempotent).
        """
        report = self.upsert_many(self.iter_jobs(), stagger=False, total=0, progress=progress)
        return report.created + report.updated

    def domain_alerts(self) -> dict[str, list[str]]:
        """The domains slower than configured, and those whose breaker is not closed."""
        infos = self.domains()
        return {"throttled": [d.name for d in infos if d.throttled],
                "breakers_open": [d.name for d in infos if d.breaker != "closed"]}

    # ------------------------------------------------------------- hot path
    @property
    def partition_bound(self) -> int:
        """The backpressure bound of one partition: its share of ``queued_bound``."""
        return math.ceil(self.settings.queued_bound / len(self.parts))

    @_unavailable
    def claim(self, limit: int | None = None) -> ClaimBatch:
        """Atomically take up to ``limit`` due jobs and mark them queued (one round trip).

        Every partition gets an equal share of ``limit``. Fewer are taken when
        the backpressure bound (``queued_bound``) is near.
        """
        limit = limit or self.settings.batch_size
        share, extra = divmod(limit, len(self.parts))
        plan = {i: share + (i < extra) for i in range(len(self.parts))}
        return merge_batches(self.claim_parts({i: n for i, n in plan.items() if n}).values())

    @_unavailable
    def claim_parts(self, plan: Mapping[int, int]) -> dict[int, ClaimBatch]:
        """Claim up to ``plan[i]`` due jobs from each partition ``i``, in one pipeline.

        Each claim is one atomic script on one partition, so every occurrence
        is claimed once however many beats claim at the same time.
        """
        # Until beat confirms the publish (routed), a claim waits under the short
        # publish deadline: a beat that dies in between costs seconds, not the
        # delivery deadline.
        args = {"deadline_ms": int(self.settings.publish_timeout_s * 1000),
                "bound": self.partition_bound, "pacing": self.pacing, "status": "queued",
                "queue": ""}
        calls: list[Call] = [(scripts.CLAIM, self.parts[i], (), {**args, "limit": n})
                             for i, n in plan.items()]
        return {i: scripts.CLAIM.reply(reply)
                for i, reply in zip(plan, self._run(calls), strict=True)}

    @_unavailable
    def claim_http(self, limit: int, queue: str = "") -> ClaimBatch:
        """The job gateway's claim: up to ``limit`` due HTTP jobs, straight to running.

        The same atomic claim as beat's, on the HTTP schedule: each occurrence
        goes to one caller, under an execution lease of ``gateway_lease_s``
        (no broker wait, so no delivery deadline). ``queue`` takes only jobs
        whose ``queue`` field is that. The batch's ``next_due_ms`` is the first
        HTTP job due in the future (the time to wake up for) of the partitions
        it looked at: all of them unless ``limit`` jobs were found first.
        """
        args: dict[str, Any] = {
            "deadline_ms": int(self.settings.gateway_lease_s * 1000),
            # The running set also holds Celery executions: no bound here.
            "bound": 2**31, "pacing": self.pacing, "status": "running", "queue": queue}
        # Partitions one after the other from a rotating start, until ``limit``
        # are found: a share of ``limit`` per partition would leave a single
        # poller waiting while its job sits in another partition.
        start = self._http_cursor
        self._http_cursor = (start + 1) % len(self.parts)
        batches, need = [], limit
        for k in range(len(self.parts)):
            part = self.parts[(start + k) % len(self.parts)]
            batch = self._call(scripts.CLAIM_HTTP, part, **args, limit=need)
            batches.append(batch)
            need -= len(batch.jobs)
            if need <= 0:
                break
        return merge_batches(batches)

    @_unavailable
    def release_http(self, claimed: Sequence[Claimed]) -> int:
        """Give back jobs the gateway claimed for a poller that went away.

        Each returns to the HTTP schedule at its due time, counting no delivery
        and no crash; an occurrence already settled or reaped is left alone.
        """
        if not claimed:
            return 0
        return sum(self._by_job(scripts.RELEASE_HTTP,
                                [(c.job.id, c.occurrence, c.attempt) for c in claimed],
                                status="running"))

    def _by_job(self, spec: ScriptSpec[Any], rows: Sequence[Sequence[Any]],
                **args: Any) -> list[Any]:
        """Run ``spec`` once per partition over the ``rows`` (id first) it holds."""
        calls: list[Call] = [(spec, self.parts[i], part_rows, args)
                             for i, part_rows in self.group(rows, _first).items()]
        return [spec.reply(reply) for reply in self._run(calls)] if calls else []

    @_unavailable
    def release(self, claimed: Sequence[Claimed]) -> int:
        """Return claimed-but-unpublished jobs to the schedule without counting a publish."""
        if not claimed:
            return 0
        return sum(self._by_job(scripts.RELEASE,
                                [(c.job.id, c.occurrence, c.attempt) for c in claimed],
                                status="queued"))

    @_unavailable
    def start(self, job_id: str, occurrence: int, attempt: int,
              expires_ms: int | None = None, *, delivery: int | None = None,
              task: str = "") -> StartResult:
        """Mark a delivered occurrence running (compare-and-set) and start its execution lease.

        Only one delivery of an occurrence and attempt gets ``runs``, and only
        one beat published: ``delivery`` is the message's delivery number
        (``None``: a message from before fencing) and ``task`` its task name
        (``""``: not checked). The result's ``fence`` numbers this execution:
        the worker keeps the lease alive with :meth:`heartbeat` and settles
        with :meth:`settle`, presenting it.
        """
        return self._call_hot(scripts.START, self.part_of(job_id), id=job_id,
                              occurrence=occurrence, attempt=attempt,
                              delivery="" if delivery is None else delivery, task=task,
                              lease_ms=int(self.settings.lease_s * 1000),
                              expires_ms="" if expires_ms is None else expires_ms,
                              pacing=self.pacing, wait_max_ms=int(START_WAIT_MAX_S * 1000))

    def heartbeat(self, running: Sequence[Running], worker: str = "",
                  queues: Sequence[str] = (), lease_s: float | None = None) -> list[str]:
        """Extend the execution leases of ``running`` (id, occurrence, attempt[, fence]).

        ``worker`` and the ``queues`` it consumes, when given, are recorded as
        alive. Returns the ids that are no longer running (settled, reaped,
        superseded, or held under another fence): stop beating for them.
        ``lease_s`` (default ``lease_s``): the new lease, from now.
        """
        gone, _ = self.beat(running, (), worker, queues, lease_s)
        return gone

    @_unavailable
    def beat(self, running: Sequence[Running], held: Sequence[Held], worker: str = "",
             queues: Sequence[str] = (), lease_s: float | None = None
             ) -> tuple[list[str], list[str]]:
        """One worker heartbeat: extend what it runs, and hold what it received.

        ``running``: (id, occurrence, attempt[, fence]) of the executions this
        process runs (without a fence: unfenced, for tests and tools).
        ``held``: (id, occurrence, attempt, delivery, task) of messages this
        worker received and has not started; each still-queued occurrence is
        held by ``worker`` for one lease from now (the first beat of one is its
        receipt), so the reaper republishes it one lease after the worker dies.
        Returns the ids no longer running, and those no longer held.
        """
        rows = [("r", row[0], row[1], row[2], row[3] if len(row) > 3 else "", "")
                for row in running]
        rows += [("h", job_id, o, a, n, task) for job_id, o, a, n, task in held]
        # Every partition hears the worker: each one's reaper asks its own
        # ``workers`` set whether a queue is consumed.
        by_part = self.group(rows, lambda row: str(row[1]))
        lease = self.settings.lease_s if lease_s is None else lease_s
        args = {"lease_ms": int(lease * 1000), "worker": worker, "queues": " ".join(queues)}
        parts = range(len(self.parts)) if worker else list(by_part)
        calls: list[Call] = [(scripts.HEARTBEAT, self.parts[i], by_part.get(i, []), args)
                             for i in parts]
        gone = [row for reply in (self._run(calls) if calls else [])
                for row in scripts.HEARTBEAT.reply(reply)]
        return ([job_id for kind, job_id in gone if kind == "r"],
                [job_id for kind, job_id in gone if kind == "h"])

    @_unavailable
    def routed(self, published: Sequence[tuple[Claimed, str]]) -> int:
        """Confirm the publish of each occurrence, with the queue it went to ("": one the
        router did not name): each moves from the publish deadline to the delivery
        deadline, and the reaper knows which workers consume it."""
        if not published:
            return 0
        return sum(self._by_job(
            scripts.ROUTED, [(c.job.id, c.occurrence, c.attempt, c.deliveries, queue, c.job.task)
                             for c, queue in published],
            delivery_ms=int(self.settings.delivery_timeout_s * 1000)))

    def announce(self, beat: str, *, gone: bool = False) -> None:
        """Record ``beat`` as alive (or, ``gone``, as stopped) for ``zsched repartition``.

        No layout check first: a beat must be seen even while it waits for one.
        """
        with redis_unavailable():
            if gone:
                self.client.zrem(self.base.beats, beat)
            else:
                self.client.zadd(self.base.beats, {beat: _time_ms(self.client.time())})

    @_unavailable
    def forget_worker(self, worker: str) -> None:
        """Drop a worker that shut down cleanly from the live workers.

        Its queues stay until they age out: another worker may consume them, and
        holding a message back a little longer is the safe mistake.
        """
        self._pipeline_each(lambda pipe, keys: pipe.zrem(keys.workers, worker))

    @_unavailable
    def retrying(self, job_id: str, occurrence: int, attempt: int, countdown_s: float, *,
                 fence: int | None = None) -> bool:
        """A running task retries through Celery's ``Task.retry``: it is queued again.

        Its retry message then starts like any first delivery, under a delivery
        deadline of ``countdown_s`` plus ``delivery_timeout_s``. Only the
        execution numbered ``fence`` may (``None``: unfenced).
        """
        deadline = int((countdown_s + self.settings.delivery_timeout_s) * 1000)
        return self._call(scripts.RETRYING, self.part_of(job_id), id=job_id,
                          occurrence=occurrence, attempt=attempt,
                          deadline_ms=deadline, countdown_ms=int(countdown_s * 1000),
                          fence="" if fence is None else fence)

    @_unavailable
    def reap(self, limit: int | None = None, max_deliveries: int | None = None,
             parts: Iterable[int] | None = None) -> ReapResult:
        """Redeliver crashed executions and lost messages; hold back ones that only wait.

        ``parts``: only these partitions (default: all), in one pipeline.
        """
        args = {"limit": limit or self.settings.batch_size,
                "max_deliveries": max_deliveries or self.settings.max_deliveries,
                "delivery_ms": int(self.settings.delivery_timeout_s * 1000),
                # Three missed heartbeats and a worker is presumed gone.
                "alive_ms": int(self.settings.heartbeat_s * 3000)}
        chosen = range(len(self.parts)) if parts is None else parts
        calls: list[Call] = [(scripts.REAP, self.parts[i], (), args) for i in chosen]
        return ReapResult.merge(scripts.REAP.reply(reply)
                                for reply in (self._run(calls) if calls else []))

    @_unavailable
    def rescue(self, taken: Sequence[tuple[str, int, int, int]]) -> list[str]:
        """Make due again the occurrences of messages a dead worker took from the broker
        without recording a hold: (id, occurrence, attempt, delivery) of each message;
        only one still queued for exactly that publish and held by no worker moves.
        Returns the ids made due."""
        if not taken:
            return []
        return [job_id for ids in self._by_job(scripts.RESCUE, taken) for job_id in ids]

    @_unavailable
    def settle(self, job_id: str, occurrence: int, attempt: int, outcome: str, *,
               error: str = "", retry_after_s: float | None = None,
               event: dict[str, Any] | None = None,
               http_status: int | None = None, fence: int | None = None,
               delivery: int | None = None,
               known: tuple[str, int] | None = None) -> SettleResult:
        """Apply an outcome (``complete``, ``error`` or ``skip``), compare-and-set.

        The next due time is computed from the stored definition and Redis'
        clock; if the definition's timing changes meanwhile, it is recomputed.
        ``http_status`` and ``retry_after_s`` also teach the job's domain (pacing).
        ``known``: the definition the start returned and an estimate of Redis'
        clock now, which spare the settle a round trip; a run "now plus a delay"
        is then moved on by however much later the script finds it, so it is
        never early, and a definition edited meanwhile is read afresh.

        Who settles (fencing): ``fence``, the execution a start or the gateway
        numbered so, while it still runs; else ``delivery``, a message that never
        started, while its occurrence is queued; with neither, an unfenced caller
        (tests and tools): whatever holds the current occurrence.
        """
        if outcome not in ("complete", "error", "skip"):
            raise ValueError(f"unknown outcome {outcome!r}")
        keys = self.part_of(job_id)
        for _ in range(5):
            raw, now = known if known is not None else self._definition_and_time(keys, job_id)
            known = None
            relative = False
            if raw is None:
                # Deleted while in flight: the script records the outcome of the
                # occurrence (if it is the current one) and forgets the job.
                job = None
                label, next_due, next_occ, next_attempt = _LABELS[outcome], None, occurrence, 1
            else:
                job = _job_of(raw)
                label, next_due, next_occ, next_attempt, relative = self._decide(
                    job, outcome, occurrence, attempt, now, retry_after_s)
            reply = self._call_hot(
                scripts.SETTLE, keys, id=job_id, occurrence=occurrence, attempt=attempt,
                outcome=outcome, label=label, next_due_ms="" if next_due is None else next_due,
                next_occurrence=next_occ, next_attempt=next_attempt, error=error[:2000],
                signature=job.timing_signature if job else "",
                max_runs=(job.max_runs or 0) if job else 0,
                events_maxlen=self.settings.events_maxlen,
                event=json.dumps(_bounded_timings(event or {}, now), separators=(",", ":")),
                http_status="" if http_status is None else http_status,
                retry_after_ms="" if retry_after_s is None else round(retry_after_s * 1000),
                pacing=self.pacing, fence="" if fence is None else fence,
                delivery="" if delivery is None else delivery,
                clock_ms=now if relative else "",
                end_ms="" if job is None or job.end_at is None else job.end_at)
            if reply.verdict == "changed":
                continue
            if job is None or reply.verdict == "deleted":
                return SettleResult(False, "deleted", label,
                                    breaker_opened=reply.breaker_opened)
            if reply.verdict == "ok" and reply.status is not None:
                return SettleResult(True, reply.status, label, reply.next_due_ms, reply.now_ms,
                                    reply.consecutive_failures, reply.breaker_opened, job)
            return SettleResult(False, reply.verdict, label, job=job)
        return SettleResult(False, "changed", outcome)

    @_unavailable
    def notice_gate(self, subject: str, notice: str, event: str, *, window_ms: int,
                    digest_ms: int, threshold: int, cap: int) -> NoticeGate:
        """May this notice go out? The notifiers' rate limit and digest, shared by every
        process (``notify.lua``; keys on the base prefix). ``subject`` "" only claims
        the digest of a window that has ended."""
        return self._call(scripts.NOTIFY, self.base, operation="gate" if subject else "flush",
                          subject=subject, window_ms=window_ms, digest_ms=digest_ms,
                          threshold=threshold, notice=notice, cap=cap, event=event)

    def _definition_and_time(self, keys: Keys, job_id: str) -> tuple[str | None, int]:
        """A job's definition and the clock of the server that holds it (one round trip)."""
        # TIME has no key to route by: on a Cluster, send it to the node of the
        # job's slot, the one whose clock the settle script will read.
        options = ({"target_nodes": self.client.get_node_from_key(keys.defs)}
                   if is_cluster(self.client) else {})
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(keys.defs, job_id)
        pipe.execute_command("TIME", **options)
        raw, reply = pipe.execute()
        return raw, _time_ms(reply)

    def _decide(self, job: Job, outcome: str, occurrence: int, attempt: int, now: int,
                retry_after_s: float | None) -> tuple[str, int | None, int, int, bool]:
        """Label, next due, next occurrence and attempt, and whether the next due is
        ``now`` plus a delay (a retry, an interval job's next run), not a fixed time."""
        if outcome == "error":
            retry = job.retry_due_ms(attempt, now, self.settings, retry_after_s)
            if retry is not None:
                return "retrying", retry, occurrence, attempt + 1, True
        next_due = job.next_regular_ms(now, self.settings, self.rng)
        return (_LABELS[outcome], next_due, next_due if next_due is not None else occurrence, 1,
                job.kind == "interval")

    @_unavailable
    def per_job(self, ids: Sequence[str], command: Callable[[Any, Keys, list[str]], None]
                ) -> list[Any]:
        """One value per id, in one pipeline: ``command(pipe, keys, members)`` queues one
        command per partition that answers a list, one value per member (ZMSCORE,
        SMISMEMBER, HMGET)."""
        if not ids:
            return []
        groups = self.group(ids)
        pipe = self.client.pipeline(transaction=False)
        for part, members in groups.items():
            command(pipe, self.parts[part], members)
        found = {job_id: value
                 for members, values in zip(groups.values(), pipe.execute(), strict=True)
                 for job_id, value in zip(members, values, strict=True)}
        return [found[job_id] for job_id in ids]

    @_unavailable
    def states(self, ids: Sequence[str]) -> list[RuntimeState | None]:
        """The runtime state of each of ``ids`` (one HMGET), ``None`` where there is none."""
        raws = self.per_job(ids, lambda pipe, keys, members: pipe.hmget(keys.state, members))
        return [RuntimeState.from_wire(raw) if raw else None for raw in raws]

    @_unavailable
    def recent_events(self, since_ms: int, count: int) -> list[dict[str, str]]:
        """The fields of the newest ``count`` settle events since ``since_ms``, newest first."""
        replies = self._pipeline_each(
            lambda pipe, keys: pipe.xrevrange(keys.events, min=f"{since_ms}-0", count=count))
        rows = heapq.merge(*(part or [] for (part,) in replies),
                           key=lambda row: stream_ids.order(str(row[0])), reverse=True)
        return [{str(k): str(v) for k, v in (fields or {}).items()}
                for _sid, fields in list(rows)[:count]]

    @_unavailable
    def dead_ids(self, limit: int) -> list[str]:
        """The ids of the ``limit`` most recently dead-lettered jobs."""
        replies = self._pipeline_each(
            lambda pipe, keys: pipe.zrevrange(keys.dead, 0, limit - 1, withscores=True))
        rows = heapq.merge(*(part for (part,) in replies), key=lambda row: row[1], reverse=True)
        return [str(job_id) for job_id, _ in list(rows)[:limit]]

    @_unavailable
    def count(self, name: str, amount: int = 1, part: int = 0) -> None:
        """Add ``amount`` to lifetime counter ``name`` of partition ``part`` (``zsched stats``
        and the exporter read them)."""
        self.client.hincrby(self.parts[part].counters, name, amount)

    @_unavailable
    def drain_cursor(self, part: int = 0) -> str:
        """Stream id of the last settle event of partition ``part`` copied into run
        history ("0" before any)."""
        return str(self.client.get(self.parts[part].drain_cursor) or "0")

    @_unavailable
    def advance_drain_cursor(self, cursor: str, part: int = 0) -> bool:
        """Move partition ``part``'s drain cursor forward to ``cursor``; never backwards
        (drains may race)."""
        return self.advance_cursor(self.parts[part].drain_cursor, cursor)

    @_unavailable
    def advance_cursor(self, key: str, cursor: str) -> bool:
        """Set the stream cursor kept at ``key`` to ``cursor``, only forward (a
        drain that races another never moves it back); False if it was not behind."""
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    current = pipe.get(key)
                    if current and stream_ids.order(str(current)) >= stream_ids.order(cursor):
                        pipe.unwatch()
                        return False
                    pipe.multi()
                    pipe.set(key, cursor)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue

    @_unavailable
    def events(self, after: str = "0", count: int = 1000,
               part: int = 0) -> list[tuple[str, dict[str, str]]]:
        """Settle events of partition ``part`` after stream id ``after`` (for run history)."""
        rows = self.client.xrange(self.parts[part].events,
                                  min=f"({after}" if after != "0" else "-", count=count)
        return [(str(i), {str(k): str(v) for k, v in (fields or {}).items()})
                for i, fields in rows or []]
