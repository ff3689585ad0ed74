"""The Redis job store: every operation is one Lua script or one pipeline."""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, ParamSpec, TypeVar

import redis
from redis.commands.core import Script

from . import scripts
from .config import Settings
from .errors import JobNotFound, redis_unavailable
from .job import Defaults, Job
from .keys import Keys
from .results import (
    TASK_ID_NAMESPACE,
    ClaimBatch,
    Claimed,
    ImportReport,
    JobInfo,
    ReapResult,
    SettleResult,
    StartResult,
    task_id_for,
)
from .scripts import ScriptSpec
from .state import RuntimeState
from .timing import jitter_ms

__all__ = [
    "TASK_ID_NAMESPACE", "ClaimBatch", "Claimed", "ImportReport", "JobInfo", "ReapResult",
    "SettleResult", "StartResult", "Store", "task_id_for",
]

P = ParamSpec("P")
R = TypeVar("R")

#: Status label of a settle that does not retry.
_LABELS = {"complete": "complete", "skip": "skipped", "error": "error"}


def _unavailable(fn: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with redis_unavailable():
            return fn(*args, **kwargs)
    return wrapper


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


def _stream_order(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms or 0), int(seq or 0)


def _first_score(*scores: float | None) -> int | None:
    """The first score that is set, as int ms (a job is in at most one of the sets)."""
    return next((int(x) for x in scores if x is not None), None)


class _ScriptStream:
    """Calls one script over one connection, sending a call before the previous reply is read.

    With at most two calls in flight, Redis executes one chunk of a bulk
    upsert while Python builds the next: the two overlap instead of taking
    turns. Replies come back in order. Clients without a single connection
    pool (Redis Cluster) run each call synchronously instead.
    """

    def __init__(self, client: Any, script: Script, keys: Sequence[str]) -> None:
        self.script = script
        self.keys = list(keys)
        self.pool: Any = getattr(client, "connection_pool", None)
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
            try:
                self.conn = self.pool.get_connection()
            except TypeError:  # redis-py < 5.3 wants a command name
                self.conn = self.pool.get_connection("EVAL")
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
    """

    def __init__(self, client: redis.Redis, settings: Settings | None = None,
                 timezone: str = "UTC") -> None:
        self.client = client
        self.settings = settings or Settings()
        self.keys = Keys.for_prefix(self.settings.key_prefix)
        self.defaults = Defaults.from_settings(self.settings, timezone)
        self.rng = random.Random()
        self._scripts: dict[str, Script] = {
            name: client.register_script(scripts.source(name)) for name in scripts.SCRIPTS
        }

    @classmethod
    def from_settings(cls, settings: Settings, timezone: str = "UTC") -> Store:
        """A store on ``settings.redis_url`` (connects lazily, on first use)."""
        client = redis.Redis.from_url(
            settings.redis_url, decode_responses=True, socket_connect_timeout=5,
            socket_timeout=30, health_check_interval=30)
        return cls(client, settings, timezone)

    # ----------------------------------------------------------------- basics
    @_unavailable
    def now_ms(self) -> int:
        """The Redis server's clock, in epoch ms."""
        return _time_ms(self.client.time())

    def _call(self, spec: ScriptSpec[R], rows: Iterable[Sequence[Any]] = (),
              **args: Any) -> R:
        """Run ``spec`` with its named ``args`` (and ``rows`` of its group); parse the reply."""
        return spec.reply(self._queue(spec, None, rows, **args))

    def _queue(self, spec: ScriptSpec[Any], client: Any, rows: Iterable[Sequence[Any]] = (),
               **args: Any) -> Any:
        """Run ``spec`` on ``client`` (a pipeline queues it): the raw reply, unparsed."""
        return self._scripts[spec.name](keys=spec.key_names(self.keys),
                                        args=spec.argv(args, rows), client=client)

    # ----------------------------------------------------------------- writes
    def upsert(self, job: Job, *, static: bool = False) -> ImportReport:
        """Store one job. A new job first runs now (cron: its next slot)."""
        return self.upsert_many([job], stagger=False, static=static)

    @_unavailable
    def upsert_many(self, jobs: Iterable[Job], *, stagger: bool = True, static: bool = False,
                    total: int | None = None,
                    progress: Callable[[int], None] | None = None,
                    first_due: dict[str, int | None] | None = None) -> ImportReport:
        """Store many jobs, pipelined in chunks; new jobs' first runs are staggered.

        Job ``i`` of ``total`` first runs at ``now + i/total * interval + jitter``,
        so an import spreads evenly over each job's interval. Jobs that already
        exist keep their schedule (ZADD NX) unless their timing changed.
        ``first_due`` (id -> epoch ms, ``None`` = never runs) overrides the first
        run of the jobs it names, e.g. to continue another scheduler's timeline.
        """
        if total is None:
            jobs = list(jobs)
            total = len(jobs)
        started = time.perf_counter()
        now = self.now_ms()
        report = ImportReport(total=total)
        chunk: list[tuple[str, ...]] = []
        flag = {"static": "1" if static else "0"}
        done = 0
        upsert = scripts.UPSERT
        with _ScriptStream(self.client, self._scripts[upsert.name],
                           upsert.key_names(self.keys)) as stream:
            for index, job in enumerate(jobs):
                phase = index / total if stagger and total else 0.0
                gap = ""
                if first_due is not None and job.id in first_due:
                    due = first_due[job.id]
                else:
                    due = job.first_due_ms(now, self.settings, self.rng, phase)
                    gap = self._gap_after_last_run(job)
                chunk.append((job.id, job.to_json(), "" if due is None else str(due),
                              "1" if job.enabled else "0", job.timing_signature, gap))
                if len(chunk) >= self.settings.import_chunk:
                    # Redis runs this chunk while the loop builds the next one.
                    for rows, result in stream.call(upsert.argv(flag, chunk), len(chunk)):
                        done = self._tally(upsert.reply(result), report, done + rows, progress)
                    chunk = []
            replies = stream.call(upsert.argv(flag, chunk), len(chunk)) if chunk else []
            for rows, result in replies + stream.drain():
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
        created, updated, rescheduled = result
        report.created += created
        report.updated += updated
        report.rescheduled += rescheduled
        if progress:
            progress(done)
        return done

    @_unavailable
    def static_ids(self) -> set[str]:
        """Ids of the jobs that came from ``beat_schedule``."""
        return {str(m) for m in self.client.smembers(self.keys.static)}

    def _control(self, op: str, ids: Sequence[str],
                 dues: Sequence[int | str] | None = None) -> int:
        rows = [(job_id, dues[i] if dues else 0) for i, job_id in enumerate(ids)]
        changed, missing = 0, []
        pipe = self.client.pipeline(transaction=False)
        size = self.settings.import_chunk
        for start in range(0, max(1, len(rows)), size):
            self._queue(scripts.CONTROL, pipe, rows[start:start + size], operation=op)
        for result in pipe.execute():
            count, not_found = scripts.CONTROL.reply(result)
            changed += count
            missing += not_found
        if missing and len(ids) == 1:
            raise JobNotFound(missing[0])
        return changed

    @_unavailable
    def delete(self, *ids: str) -> int:
        """Delete jobs; an in-flight occurrence's settle will not bring them back."""
        return self._control("delete", ids)

    @_unavailable
    def pause(self, *ids: str) -> int:
        """Pause jobs; an in-flight occurrence still settles but is not rescheduled."""
        return self._control("pause", ids)

    @_unavailable
    def resume(self, *ids: str) -> int:
        """Resume paused (or dead-lettered) jobs; they never run earlier than they would have.

        An interval job runs at its last run + interval (or now, if that has
        passed), plus jitter; a cron job at its next slot after now; a job that
        never ran follows the first-run rule.
        """
        now = self.now_ms()
        dues: list[int | str] = []
        for info in self.get_many(ids):
            due = self._resume_due(info, now) if info else now
            # "" tells the script the job is over (its end_at has passed): it is
            # unpaused but finished, never run once more.
            dues.append("" if due is None else due)
        return self._control("resume", ids, dues)

    def _resume_due(self, info: JobInfo, now: int) -> int | None:
        job, last = info.job, info.state.last_settled_ms
        start = now
        if job.kind == "interval" and job.interval_s is not None and last is not None:
            start = max(now, last + round(job.interval_s * 1000))
        return job.first_due_ms(start, self.settings, self.rng)

    @_unavailable
    def run_now(self, *ids: str) -> int:
        """Make jobs due now (jobs in flight are left alone)."""
        return self._control("run_now", ids)

    @_unavailable
    def reset_failures(self, *ids: str) -> int:
        """Zero failure counters; a dead-lettered job is brought back as due now."""
        return self._control("reset", ids)

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
        """Many jobs in one round trip of six commands, ``None`` for ids that do not exist."""
        if not ids:
            return []
        ids = list(ids)
        # ZMSCORE/SMISMEMBER (Redis >= 6.2) keep this at six commands however
        # many ids a page or a bulk action asks for.
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.keys.defs, ids)
        pipe.hmget(self.keys.state, ids)
        pipe.zmscore(self.keys.schedule, ids)
        pipe.zmscore(self.keys.leases, ids)
        pipe.zmscore(self.keys.queued, ids)
        pipe.smismember(self.keys.paused, ids)
        defs, states, dues, leases, queued, paused = pipe.execute()
        out: list[JobInfo | None] = []
        for i, raw in enumerate(defs):
            if raw is None:
                out.append(None)
                continue
            state = RuntimeState.from_wire(states[i])
            out.append(JobInfo(
                job=_as_paused(Job.from_json(raw), bool(paused[i])),
                status=state.status,
                due_ms=int(dues[i]) if dues[i] is not None else None,
                lease_until_ms=_first_score(leases[i], queued[i]),
                paused=bool(paused[i]), state=state))
        return out

    @_unavailable
    def list_jobs(self, offset: int = 0, limit: int = 50) -> list[JobInfo]:
        """Scheduled jobs ordered by due time, one page."""
        ids = [str(i) for i in self.client.zrange(self.keys.schedule, offset, offset + limit - 1)]
        return [info for info in self.get_many(ids) if info is not None]

    def iter_jobs(self, count: int = 1000) -> Iterator[Job]:
        """Every stored definition once (HSCAN: constant memory), for export and sync.

        ``enabled`` is read from the paused set, like everywhere else, so an
        export re-imports with the paused state it has now.
        Raises :class:`StoreUnavailable` if Redis goes away mid-scan.
        """
        # HSCAN may return an entry twice while the hash is rehashing; ids are
        # remembered so every job is yielded once (an id costs far less than a job).
        seen: set[str] = set()
        cursor = 0
        # A generator runs after the decorator returned, so it guards itself.
        with redis_unavailable():
            while True:
                cursor, page = self.client.hscan(self.keys.defs, cursor, count=count)
                assert isinstance(page, dict)  # HSCAN replies pairs; redis-py makes a dict
                fresh = [(str(job_id), raw) for job_id, raw in page.items()
                         if job_id not in seen]
                if fresh:
                    flags = self.client.smismember(self.keys.paused, [i for i, _ in fresh])
                    for (job_id, raw), paused in zip(fresh, flags, strict=True):
                        seen.add(job_id)
                        yield _as_paused(Job.from_json(raw), bool(paused))
                if not cursor:
                    return

    @_unavailable
    def peek_next_due(self) -> int | None:
        """Due time of the earliest scheduled job."""
        first = self.client.zrange(self.keys.schedule, 0, 0, withscores=True)
        return int(first[0][1]) if first else None

    @_unavailable
    def stats(self) -> dict[str, int]:
        """Counts by state, jobs due soon, and lifetime counters."""
        now = self.now_ms()
        pipe = self.client.pipeline(transaction=False)
        pipe.hlen(self.keys.defs)
        pipe.zcard(self.keys.schedule)
        pipe.zcard(self.keys.queued)
        pipe.zcard(self.keys.leases)
        pipe.scard(self.keys.paused)
        pipe.zcard(self.keys.dead)
        pipe.zcount(self.keys.schedule, "-inf", now)
        pipe.zcount(self.keys.schedule, "-inf", now + 60_000)
        pipe.zcount(self.keys.schedule, "-inf", now + 3_600_000)
        pipe.hgetall(self.keys.counters)
        (jobs, scheduled, queued, running, paused, dead, due, minute, hour,
         counters) = pipe.execute()
        out = {"jobs": jobs, "scheduled": scheduled, "in_flight": queued + running,
               "queued": queued, "running": running, "paused": paused,
               "dead": dead, "due_now": due, "due_next_minute": minute, "due_next_hour": hour}
        out.update({f"total_{k}": int(v) for k, v in counters.items()})
        return out

    # ------------------------------------------------------------- hot path
    @_unavailable
    def claim(self, limit: int | None = None) -> ClaimBatch:
        """Atomically take up to ``limit`` due jobs and mark them queued (one round trip).

        Fewer are taken when the backpressure bound (``queued_bound``) is near.
        """
        return self._call(scripts.CLAIM, limit=limit or self.settings.batch_size,
                          delivery_ms=int(self.settings.delivery_timeout_s * 1000),
                          bound=self.settings.queued_bound)

    @_unavailable
    def release(self, claimed: Sequence[Claimed]) -> int:
        """Return claimed-but-unpublished jobs to the schedule without counting a publish."""
        if not claimed:
            return 0
        return self._call(scripts.RELEASE, [(c.job.id, c.occurrence, c.attempt) for c in claimed])

    @_unavailable
    def start(self, job_id: str, occurrence: int, attempt: int,
              expires_ms: int | None = None) -> StartResult:
        """Mark a delivered occurrence running (compare-and-set) and start its execution lease.

        Only one delivery of an occurrence and attempt gets ``runs``; the worker
        must keep the lease alive with :meth:`heartbeat` while the task runs.
        """
        return self._call(scripts.START, id=job_id, occurrence=occurrence, attempt=attempt,
                          lease_ms=int(self.settings.lease_s * 1000),
                          expires_ms="" if expires_ms is None else expires_ms)

    @_unavailable
    def heartbeat(self, running: Sequence[tuple[str, int, int]], worker: str = "",
                  queues: Sequence[str] = ()) -> list[str]:
        """Extend the execution leases of ``running`` (id, occurrence, attempt) triples.

        ``worker`` and the ``queues`` it consumes, when given, are recorded as
        alive. Returns the ids that are no longer running (settled, reaped or
        superseded): stop beating for them.
        """
        return self._call(scripts.HEARTBEAT, running,
                          lease_ms=int(self.settings.lease_s * 1000), worker=worker,
                          queues=" ".join(queues))

    @_unavailable
    def routed(self, published: Sequence[tuple[Claimed, str]]) -> int:
        """Record the queue each published occurrence went to (for the reaper)."""
        if not published:
            return 0
        return self._call(scripts.ROUTED, [(c.job.id, c.occurrence, c.attempt, queue)
                                           for c, queue in published])

    @_unavailable
    def forget_worker(self, worker: str) -> None:
        """Drop a worker that shut down cleanly from the live workers.

        Its queues stay until they age out: another worker may consume them, and
        holding a message back a little longer is the safe mistake.
        """
        self.client.zrem(self.keys.workers, worker)

    @_unavailable
    def retrying(self, job_id: str, occurrence: int, attempt: int, countdown_s: float) -> bool:
        """A running task retries through Celery's ``Task.retry``: it is queued again.

        Its retry message then starts like any first delivery, under a delivery
        deadline of ``countdown_s`` plus ``delivery_timeout_s``.
        """
        deadline = int((countdown_s + self.settings.delivery_timeout_s) * 1000)
        return self._call(scripts.RETRYING, id=job_id, occurrence=occurrence, attempt=attempt,
                          deadline_ms=deadline)

    @_unavailable
    def reap(self, limit: int | None = None, max_deliveries: int | None = None) -> ReapResult:
        """Redeliver crashed executions and lost messages; hold back ones that only wait."""
        return self._call(scripts.REAP, limit=limit or self.settings.batch_size,
                          max_deliveries=max_deliveries or self.settings.max_deliveries,
                          delivery_ms=int(self.settings.delivery_timeout_s * 1000),
                          # Three missed heartbeats and a worker is presumed gone.
                          alive_ms=int(self.settings.heartbeat_s * 3000))

    @_unavailable
    def settle(self, job_id: str, occurrence: int, attempt: int, outcome: str, *,
               error: str = "", retry_after_s: float | None = None,
               event: dict[str, Any] | None = None) -> SettleResult:
        """Apply an outcome (``complete``, ``error`` or ``skip``), compare-and-set.

        The next due time is computed from the stored definition and Redis'
        clock; if the definition's timing changes meanwhile, it is recomputed.
        """
        if outcome not in ("complete", "error", "skip"):
            raise ValueError(f"unknown outcome {outcome!r}")
        for _ in range(5):
            pipe = self.client.pipeline(transaction=False)
            pipe.hget(self.keys.defs, job_id)
            pipe.time()
            raw, reply = pipe.execute()
            now = _time_ms(reply)
            if raw is None:
                # Deleted while in flight: the script records the outcome of the
                # occurrence (if it is the current one) and forgets the job.
                job = None
                label, next_due, next_occ, next_attempt = _LABELS[outcome], None, occurrence, 1
            else:
                job = Job.from_json(raw)
                label, next_due, next_occ, next_attempt = self._decide(
                    job, outcome, occurrence, attempt, now, retry_after_s)
            verdict, status, settled_ms = self._call(
                scripts.SETTLE, id=job_id, occurrence=occurrence, attempt=attempt,
                outcome=outcome, label=label, next_due_ms="" if next_due is None else next_due,
                next_occurrence=next_occ, next_attempt=next_attempt, error=error[:2000],
                signature=job.timing_signature if job else "",
                max_runs=(job.max_runs or 0) if job else 0,
                events_maxlen=self.settings.events_maxlen,
                event=json.dumps(event or {}, separators=(",", ":")))
            if verdict == "changed":
                continue
            if job is None:
                return SettleResult(False, "deleted", label)
            if verdict == "ok" and status is not None:
                return SettleResult(True, status, label, next_due, settled_ms)
            return SettleResult(False, verdict, label)
        return SettleResult(False, "changed", outcome)

    def _decide(self, job: Job, outcome: str, occurrence: int, attempt: int, now: int,
                retry_after_s: float | None) -> tuple[str, int | None, int, int]:
        if outcome == "error":
            retry = job.retry_due_ms(attempt, now, self.settings, retry_after_s)
            if retry is not None:
                return "retrying", retry, occurrence, attempt + 1
        next_due = job.next_regular_ms(now, self.settings, self.rng)
        return _LABELS[outcome], next_due, next_due if next_due is not None else occurrence, 1

    @_unavailable
    def states(self, ids: Sequence[str]) -> list[RuntimeState | None]:
        """The runtime state of each of ``ids`` (one HMGET), ``None`` where there is none."""
        if not ids:
            return []
        return [RuntimeState.from_wire(raw) if raw else None
                for raw in self.client.hmget(self.keys.state, list(ids))]

    @_unavailable
    def recent_events(self, since_ms: int, count: int) -> list[dict[str, str]]:
        """The fields of the newest ``count`` settle events since ``since_ms``, newest first."""
        rows = self.client.xrevrange(self.keys.events, min=f"{since_ms}-0", count=count)
        return [{str(k): str(v) for k, v in (fields or {}).items()} for _sid, fields in rows or []]

    @_unavailable
    def dead_ids(self, limit: int) -> list[str]:
        """The ids of the ``limit`` most recently dead-lettered jobs."""
        return [str(i) for i in self.client.zrevrange(self.keys.dead, 0, limit - 1)]

    @_unavailable
    def drain_cursor(self) -> str:
        """Stream id of the last settle event copied into run history ("0" before any)."""
        return str(self.client.get(self.keys.drain_cursor) or "0")

    @_unavailable
    def advance_drain_cursor(self, cursor: str) -> bool:
        """Move the drain cursor forward to ``cursor``; never backwards (drains may race)."""
        key = self.keys.drain_cursor
        with self.client.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key)  # type: ignore[no-untyped-call]
                    current = pipe.get(key)
                    if current and _stream_order(str(current)) >= _stream_order(cursor):
                        pipe.unwatch()
                        return False
                    pipe.multi()
                    pipe.set(key, cursor)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue

    @_unavailable
    def events(self, after: str = "0", count: int = 1000) -> list[tuple[str, dict[str, str]]]:
        """Settle events after stream id ``after`` (for run history)."""
        rows = self.client.xrange(self.keys.events, min=f"({after}" if after != "0" else "-",
                                  count=count)
        return [(str(i), {str(k): str(v) for k, v in (fields or {}).items()})
                for i, fields in rows or []]
