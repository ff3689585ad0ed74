"""The hot path: the delivery contract's scripts, called once per occurrence or batch."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from celery_zsched.core.job import Job
from celery_zsched.core.results import (
    ClaimBatch,
    Claimed,
    ReapResult,
    SettleResult,
    StartResult,
    merge_batches,
)
from celery_zsched.store import scripts
from celery_zsched.store.base import Call, Held, Running, time_ms, unavailable
from celery_zsched.store.connection import is_cluster
from celery_zsched.store.errors import redis_unavailable
from celery_zsched.store.keys import Keys
from celery_zsched.store.writes import Writes

#: How far a settle event's times may lie from Redis' clock, and its spans run,
#: before they are dropped as nonsense (a worker's microseconds, a forged 10**30):
#: the run history must be able to convert every event it is given.
_TIMING_WINDOW_MS = 20 * 366 * 86_400_000  # 20 years


_EPOCH_FIELDS = ("due_ms", "promoted_ms", "started_ms", "finished_ms")


_SPAN_FIELDS = ("lateness_ms", "wait_ms", "duration_ms")


def bounded_timings(event: Mapping[str, Any], now: int) -> dict[str, Any]:
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
LABELS = {"complete": "complete", "skip": "skipped", "error": "error"}


#: Longest a worker sits out a closed domain gate at start before it hands the
#: occurrence back to the schedule instead (a prefork slot waits meanwhile).
START_WAIT_MAX_S = 2.0


@functools.lru_cache(maxsize=4096)
def job_of(raw: str) -> Job:
    """The job of a definition JSON: a worker settles the same jobs again and again."""
    return Job.from_json(raw)


class HotPath(Writes):
    """Claim, publish confirmation, start, heartbeat, retry, settle, reap and rescue:
    what beat, the workers and the gateway call for every occurrence."""

    # ------------------------------------------------------------- hot path
    @property
    def partition_bound(self) -> int:
        """The backpressure bound of one partition: its share of ``queued_bound``."""
        return math.ceil(self.settings.queued_bound / len(self.parts))

    @unavailable
    def claim(self, limit: int | None = None) -> ClaimBatch:
        """Atomically take up to ``limit`` due jobs and mark them queued (one round trip).

        Every partition gets an equal share of ``limit``. Fewer are taken when
        the backpressure bound (``queued_bound``) is near.
        """
        limit = limit or self.settings.batch_size
        share, extra = divmod(limit, len(self.parts))
        plan = {i: share + (i < extra) for i in range(len(self.parts))}
        return merge_batches(self.claim_parts({i: n for i, n in plan.items() if n}).values())

    @unavailable
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

    @unavailable
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

    @unavailable
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

    @unavailable
    def release(self, claimed: Sequence[Claimed]) -> int:
        """Return claimed-but-unpublished jobs to the schedule without counting a publish."""
        if not claimed:
            return 0
        return sum(self._by_job(scripts.RELEASE,
                                [(c.job.id, c.occurrence, c.attempt) for c in claimed],
                                status="queued"))

    @unavailable
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

    @unavailable
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

    @unavailable
    def hold(self, held: Held, worker: str) -> bool:
        """Hold one received message for ``worker`` now, for one lease (one round trip):
        :meth:`beat` with just that row. False when its occurrence is no longer
        queued for it (started, settled, republished for another task)."""
        job_id, occurrence, attempt, delivery, task = held
        gone = self._call_hot(scripts.HEARTBEAT, self.part_of(job_id),
                              [("h", job_id, occurrence, attempt, delivery, task)],
                              lease_ms=int(self.settings.lease_s * 1000), worker=worker,
                              queues="")
        return not gone

    @unavailable
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
                self.client.zadd(self.base.beats, {beat: time_ms(self.client.time())})

    @unavailable
    def forget_worker(self, worker: str) -> None:
        """Drop a worker that shut down cleanly from the live workers.

        Its queues stay until they age out: another worker may consume them, and
        holding a message back a little longer is the safe mistake.
        """
        self._pipeline_each(lambda pipe, keys: pipe.zrem(keys.workers, worker))

    @unavailable
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

    @unavailable
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

    @unavailable
    def rescue(self, taken: Sequence[tuple[str, int, int, int]]) -> list[str]:
        """Make due again the occurrences of messages a dead worker took from the broker
        without recording a hold: (id, occurrence, attempt, delivery) of each message;
        only one still queued for exactly that publish and held by no worker moves.
        Returns the ids made due."""
        if not taken:
            return []
        return [job_id for ids in self._by_job(scripts.RESCUE, taken) for job_id in ids]

    @unavailable
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
                label, next_due, next_occ, next_attempt = LABELS[outcome], None, occurrence, 1
            else:
                job = job_of(raw)
                label, next_due, next_occ, next_attempt, relative = self._decide(
                    job, outcome, occurrence, attempt, now, retry_after_s)
            reply = self._call_hot(
                scripts.SETTLE, keys, id=job_id, occurrence=occurrence, attempt=attempt,
                outcome=outcome, label=label, next_due_ms="" if next_due is None else next_due,
                next_occurrence=next_occ, next_attempt=next_attempt, error=error[:2000],
                signature=job.timing_signature if job else "",
                max_runs=(job.max_runs or 0) if job else 0,
                events_maxlen=self.settings.events_maxlen,
                event=json.dumps(bounded_timings(event or {}, now), separators=(",", ":")),
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
        return raw, time_ms(reply)

    def _decide(self, job: Job, outcome: str, occurrence: int, attempt: int, now: int,
                retry_after_s: float | None) -> tuple[str, int | None, int, int, bool]:
        """Label, next due, next occurrence and attempt, and whether the next due is
        ``now`` plus a delay (a retry, an interval job's next run), not a fixed time."""
        if outcome == "error":
            retry = job.retry_due_ms(attempt, now, self.settings, retry_after_s)
            if retry is not None:
                return "retrying", retry, occurrence, attempt + 1, True
        next_due = job.next_regular_ms(now, self.settings, self.rng)
        return (LABELS[outcome], next_due, next_due if next_due is not None else occurrence, 1,
                job.kind == "interval")
