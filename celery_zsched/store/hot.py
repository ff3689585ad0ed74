"""The hot path: the delivery contract's scripts, called once per occurrence or batch."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from celery_zsched.core.results import (
    ClaimBatch,
    Claimed,
    ReapResult,
    StartResult,
    merge_batches,
)
from celery_zsched.store import scripts
from celery_zsched.store.base import Call, Held, Running, time_ms, unavailable
from celery_zsched.store.connection import is_cluster
from celery_zsched.store.errors import redis_unavailable
from celery_zsched.store.replicas import call_replicated
from celery_zsched.store.settles import Settles

logger = logging.getLogger("celery_zsched")

#: Longest a worker sits out a closed domain gate at start before it hands the
#: occurrence back to the schedule instead (a prefork slot waits meanwhile).
START_WAIT_MAX_S = 2.0
#: Most replies left unread on the lane before a call sent ahead reads them first.
LANE_MAX_PENDING = 64


def line_of(queue: str, priority: int | None = None) -> str:
    """The broker list a message waits in, as the store names it: its queue and its
    priority (kombu's Redis transport keeps one list per priority; ``_prelude.lua``'s
    ``line_of`` is the same)."""
    return f"{queue}\x1f{'' if priority is None else priority}"


def every_line_of(queue: str) -> str:
    """A mark under this name holds for every priority of ``queue`` (``lost.lua``)."""
    return f"{queue}\x1f*"


class HotPath(Settles):
    """Claim, publish confirmation, start, heartbeat, retry, settle, reap and rescue:
    what beat, the workers and the gateway call for every occurrence."""

    # ------------------------------------------------------------- hot path
    @property
    def partition_bound(self) -> int:
        """The backpressure bound of one partition: its share of ``queued_bound``."""
        return math.ceil(self.settings.queued_bound / len(self.parts))

    @property
    def partition_queue_bound(self) -> int:
        """The per-queue backpressure bound of one partition: its share of ``queue_bound``."""
        return math.ceil(self.settings.queue_bound / len(self.parts))

    @property
    def alive_ms(self) -> int:
        """How long after its last heartbeat a worker counts as alive: three missed
        heartbeats and it is presumed gone."""
        return int(self.settings.heartbeat_s * 3000)

    @unavailable
    def claim(self, limit: int | None = None) -> ClaimBatch:
        """Atomically take up to ``limit`` due jobs and mark them queued (one round trip).

        Every partition gets an equal share of ``limit``. Fewer are taken when
        the backpressure bound (``queued_bound``) is near; a job whose queue holds
        ``queue_bound`` occurrences is held back in the schedule instead.
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
                "queue": "", "queue_bound": self.partition_queue_bound}
        calls: list[Call] = [(scripts.CLAIM, self.parts[i], (), {**args, "limit": n})
                             for i, n in plan.items()]
        batches = {i: scripts.CLAIM.reply(reply)
                   for i, reply in zip(plan, self._run(calls), strict=True)}
        if self.layout.by_domain:
            for i, batch in batches.items():
                batch.jobs[:] = [dataclasses.replace(c, partition=f"{i}@{self.layout}")
                                 for c in batch.jobs]
        return batches

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
            "bound": 2**31, "pacing": self.pacing, "status": "running", "queue": queue,
            "queue_bound": 0}
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
        args: dict[str, Any] = {"id": job_id, "occurrence": occurrence, "attempt": attempt,
                                "delivery": "" if delivery is None else delivery, "task": task,
                                "lease_ms": int(self.settings.lease_s * 1000),
                                "expires_ms": "" if expires_ms is None else expires_ms,
                                "pacing": self.pacing,
                                "wait_max_ms": int(START_WAIT_MAX_S * 1000)}
        keys = self.part_of(job_id)
        if self.pacing and is_cluster(self.client):
            # A failover must not forget the domain's last start (see replicas.py).
            spec = scripts.START
            return spec.reply(call_replicated(self.client, self._scripts[spec.name],
                                              spec.key_names(keys), spec.argv(args)))
        if self.lane is not None and (self.lane.pending or self.lane.keep):
            # Behind the last task's settle sent ahead, on its connection: one read
            # takes both replies, and no second connection is checked out. A lane
            # that keeps its connection (a prefork pool process) takes the start
            # with no settle ahead of it too (the first task, or one after the
            # collector's timer read the last reply).
            spec = scripts.START
            try:
                done = self.lane.call(self._scripts[spec.name], spec.key_names(keys),
                                      spec.argv(args))
            except (RedisConnectionError, RedisTimeoutError):
                # Not sent: the lane's connection had broken (a kept one, idle since a
                # restart of Redis). The lane dropped it; the usual way reconnects.
                done = None
            if done is not None:
                reply, earlier = done
                self.hand_over(earlier)
                if reply is not None:
                    return spec.reply(reply)
            # The lane was busy in another thread, or no reply could be had (a server
            # that lost the script, a broken connection): the usual way, which loads
            # the script. Sent again, a start that did apply finds its occurrence
            # running and drops this delivery: never two runs.
        return self._call_hot(scripts.START, keys, **args)

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
    def hold(self, held: Sequence[Held], worker: str) -> list[str]:
        """Hold received messages for ``worker`` now, for one lease (one round trip per
        partition): :meth:`beat` with just these rows. Returns the ids no longer
        held: their occurrence is no longer queued for them (started, settled,
        republished for another task)."""
        if not held:
            return []
        rows = [("h", job_id, o, a, n, task) for job_id, o, a, n, task in held]
        lease_ms = int(self.settings.lease_s * 1000)
        groups = self.group(rows, lambda row: str(row[1]))
        if len(groups) == 1:  # the usual case: one partition, straight on a pooled connection
            (part, part_rows), = groups.items()
            gone = self._call_hot(scripts.HEARTBEAT, self.parts[part], part_rows,
                                  lease_ms=lease_ms, worker=worker, queues="")
        else:
            args = {"lease_ms": lease_ms, "worker": worker, "queues": ""}
            calls: list[Call] = [(scripts.HEARTBEAT, self.parts[i], part_rows, args)
                                 for i, part_rows in groups.items()]
            gone = [row for reply in self._run(calls) for row in scripts.HEARTBEAT.reply(reply)]
        return [job_id for _, job_id in gone]

    @unavailable
    def hold_soon(self, held: Sequence[Held], worker: str,
                  then: Callable[[Sequence[Held], list[str] | None], None]) -> None:
        """:meth:`hold` of these messages, sent now (one call per partition); each call's
        reply is read by the next :meth:`collect`, which hands ``then`` that call's rows
        and the ids no longer held (``None``: no reply could be had; hold them the usual
        way). A store without a lane holds at once."""
        if not held:
            return
        if self.lane is None:
            then(held, self.hold(held, worker))
            return
        if self.lane.pending >= LANE_MAX_PENDING:
            self.collect()  # nobody read for a while (an idle worker): keep the backlog short
        args = {"lease_ms": int(self.settings.lease_s * 1000), "worker": worker, "queues": ""}
        groups = self.group(held, lambda row: row[0])
        for part, rows in groups.items():
            def on_reply(reply: Any, rows: Sequence[Held] = rows) -> None:
                then(rows, None if reply is None
                     else [job_id for _, job_id in scripts.HEARTBEAT.reply(reply)])
            with redis_unavailable():
                self.lane.send(self._scripts[scripts.HEARTBEAT.name],
                               scripts.HEARTBEAT.key_names(self.parts[part]),
                               scripts.HEARTBEAT.argv(args, [("h", *row) for row in rows]),
                               on_reply)

    @unavailable
    def routed(self, published: Sequence[tuple[Claimed, str]]) -> int:
        """Confirm the publish of each occurrence, with the queue it went to ("": one the
        router did not name): each moves from the publish deadline to the delivery
        deadline, and the reaper knows which workers consume it."""
        if not published:
            return 0
        return sum(self._by_job(
            scripts.ROUTED, [(c.job.id, c.occurrence, c.attempt, c.deliveries, queue, c.job.task,
                              "" if c.job.priority is None else c.job.priority)
                             for c, queue in published],
            delivery_ms=int(self.settings.delivery_timeout_s * 1000)))

    @unavailable
    def received_marks(self) -> dict[str, int]:
        """Per line (:func:`line_of`), the latest promotion time a worker's start saw, over
        every partition: each line's messages promoted well before it have left the
        broker's list (one pipeline)."""
        pipe = self.client.pipeline(transaction=False)
        for keys in self.parts:
            pipe.hgetall(keys.received)
        marks: dict[str, int] = {}
        for part in pipe.execute():
            for line, mark in part.items():
                marks[line] = max(marks.get(line, 0), int(float(mark)))
        return marks

    @unavailable
    def consumed(self, queues: Sequence[str]) -> set[str]:
        """Which of ``queues`` a live worker consumes now (its heartbeat names them;
        ``""``: a queue the router did not name, consumed while any worker is alive)."""
        if not queues:
            return set()
        keys = self.parts[0]
        since = time_ms(self.client.time()) - self.alive_ms
        pipe = self.client.pipeline(transaction=False)
        pipe.zmscore(keys.workers, [f"q:{q}" for q in queues])
        pipe.zcount(keys.workers, since, "+inf")
        seen, any_alive = pipe.execute()
        return {q for q, at in zip(queues, seen, strict=True)
                if (any_alive if q == "" else at is not None and at >= since)}

    @unavailable
    def rescue_lost(self, marks: Mapping[str, int], slack_ms: int,
                    limit: int = 1000) -> list[str]:
        """Make due again the occurrences whose messages a dead worker took from the broker
        unrecorded, judged by ``marks`` (line -> promotion time before which the line's
        messages have left its list; :func:`every_line_of` a queue: each of its lines):
        confirmed, held by no worker, promoted ``slack_ms`` before their line's mark.
        ``limit``: most queued entries each partition looks at. Returns the ids."""
        if not marks:
            return []
        reach = int((self.settings.publish_timeout_s + self.settings.delivery_timeout_s) * 1000)
        near = max(self.settings.lease_s, self.settings.publish_timeout_s)
        args = {"limit": limit, "deadline_max_ms": max(marks.values()) + reach,
                "slack_ms": slack_ms, "near_ms": int(near * 1000)}
        rows = sorted(marks.items())
        calls: list[Call] = [(scripts.LOST, keys, rows, args) for keys in self.parts]
        return [job_id for reply in self._run(calls) for job_id in scripts.LOST.reply(reply)]

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
                "alive_ms": self.alive_ms}
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
