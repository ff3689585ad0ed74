"""Settling: a task's outcome applied to its job, compare-and-set, waited for or sent ahead."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery_zsched.core.job import Job
from celery_zsched.core.recrawl import Visit, recrawl_policy
from celery_zsched.core.results import SettleResult
from celery_zsched.core.timing import jitter_ms
from celery_zsched.store import scripts
from celery_zsched.store.base import time_ms, unavailable
from celery_zsched.store.connection import is_cluster
from celery_zsched.store.errors import redis_unavailable
from celery_zsched.store.keys import Keys
from celery_zsched.store.lane import OnReply
from celery_zsched.store.writes import Writes

logger = logging.getLogger("celery_zsched")

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


#: The settle script's visit arguments of a task that reported none, of a fixed job.
_NO_VISIT = Visit().settle_args(None)

#: Status label of a settle that does not retry.
LABELS = {"complete": "complete", "skip": "skipped", "error": "error",
          "blocked": "blocked_by_robots"}


@functools.lru_cache(maxsize=4096)
def job_of(raw: str) -> Job:
    """The job of a definition JSON: a worker settles the same jobs again and again."""
    return Job.from_json(raw)


class Settles(Writes):
    """The settle of an occurrence, as a round trip or sent ahead of its reply."""

    @unavailable
    def settle(self, job_id: str, occurrence: int, attempt: int, outcome: str, *,
               error: str = "", retry_after_s: float | None = None,
               event: dict[str, Any] | None = None,
               http_status: int | None = None, fence: int | None = None,
               delivery: int | None = None,
               known: tuple[str, int] | None = None,
               visit: Visit | None = None) -> SettleResult:
        """Apply an outcome (``complete``, ``error``, ``skip`` or ``blocked``), compare-and-set.

        ``blocked`` (robots.txt disallows the job's URL; label
        ``blocked_by_robots``) sent no request: the job waits ``retry_after_s``
        (its ``max_interval_s``, or ``zsched_robots_block_s``), or its own
        interval if that is longer; a one-off job ends.

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
        if outcome not in LABELS:
            raise ValueError(f"unknown outcome {outcome!r}")
        keys = self.part_of(job_id)
        for _ in range(5):
            raw, now = known if known is not None else self._definition_and_time(keys, job_id)
            known = None
            job, label, args = self._settle_args(
                job_id, occurrence, attempt, outcome, raw, now, error=error,
                retry_after_s=retry_after_s, event=event, http_status=http_status, fence=fence,
                delivery=delivery, visit=visit)
            result = self._settle_result(job, label, self._call_hot(scripts.SETTLE, keys, **args))
            if result is not None:
                return result
        return SettleResult(False, "changed", outcome)

    @unavailable
    def settle_soon(self, job_id: str, occurrence: int, attempt: int, outcome: str,
                    then: Callable[[SettleResult | None], None], *, known: tuple[str, int],
                    error: str = "", retry_after_s: float | None = None,
                    event: dict[str, Any] | None = None, http_status: int | None = None,
                    fence: int | None = None, visit: Visit | None = None) -> None:
        """:meth:`settle`, sent now and applied by Redis as it arrives; its reply is read
        by the next :meth:`collect` (a worker's next start, or its timer), which hands
        the result to ``then``.

        ``then`` gets ``None`` when there is no result to hand over (the
        definition's timing changed meanwhile, the connection broke, the server
        had not loaded the script): the caller settles again with :meth:`settle`,
        which is safe, because a settle is a compare-and-set. A store without a
        lane (Redis Cluster) settles at once.
        """
        if outcome not in LABELS:
            raise ValueError(f"unknown outcome {outcome!r}")
        if self.lane is None:
            then(self.settle(job_id, occurrence, attempt, outcome, error=error,
                             retry_after_s=retry_after_s, event=event, http_status=http_status,
                             fence=fence, known=known, visit=visit))
            return
        keys = self.part_of(job_id)
        job, label, args = self._settle_args(
            job_id, occurrence, attempt, outcome, *known, error=error,
            retry_after_s=retry_after_s, event=event, http_status=http_status, fence=fence,
            delivery=None, visit=visit)

        def on_reply(reply: Any) -> None:
            then(None if reply is None
                 else self._settle_result(job, label, scripts.SETTLE.reply(reply)))
        with redis_unavailable():
            self.lane.send(self._scripts[scripts.SETTLE.name], scripts.SETTLE.key_names(keys),
                           scripts.SETTLE.argv(args, ()), on_reply)

    def collect(self) -> int:
        """Read the replies of every :meth:`settle_soon` sent so far and hand each over
        (in this thread); how many there were."""
        if self.lane is None or not self.lane.pending:
            return 0
        return self.hand_over(self.lane.collect())

    @staticmethod
    def hand_over(replies: Sequence[tuple[OnReply, Any]]) -> int:
        """Hand each reply read off the lane to its receiver; how many there were."""
        for on_reply, reply in replies:
            try:
                on_reply(reply)
            except Exception:  # one receiver's bug must not cost the others their reply
                logger.exception("zsched: handling a settle's reply failed")
        return len(replies)

    def _settle_args(self, job_id: str, occurrence: int, attempt: int, outcome: str,
                     raw: str | None, now: int, *, error: str, retry_after_s: float | None,
                     event: dict[str, Any] | None, http_status: int | None,
                     fence: int | None, delivery: int | None, visit: Visit | None = None
                     ) -> tuple[Job | None, str, dict[str, Any]]:
        """The job, the status label and the settle script's arguments, decided from the
        definition ``raw`` (``None``: deleted) and Redis' clock ``now``."""
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
        return job, label, dict(
            id=job_id, occurrence=occurrence, attempt=attempt,
            # A blocked run sent no request: to the script (and the domain's
            # pacing) it is a skip, under its own label.
            outcome="skip" if outcome == "blocked" else outcome, label=label,
            next_due_ms="" if next_due is None else next_due,
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
            end_ms="" if job is None or job.end_at is None else job.end_at,
            **self._visit_args(job, visit))

    def _visit_args(self, job: Job | None, visit: Visit | None) -> dict[str, str]:
        """The settle script's arguments for what the visit saw and the job's recrawl policy."""
        policy = None if job is None else recrawl_policy(
            job, self.settings.freshness_target,
            jitter_ms(job.effective_jitter_s(self.settings), self.rng),
            self.settings.recrawl_allocation)
        if visit is None and policy is None:
            return _NO_VISIT  # the usual case, built once
        return (visit or Visit()).settle_args(policy)

    @staticmethod
    def _settle_result(job: Job | None, label: str, reply: Any) -> SettleResult | None:
        """What a settle script's parsed ``reply`` means; ``None``: the definition's timing
        changed since it was read (decide again)."""
        if reply.verdict == "changed":
            return None
        if job is None or reply.verdict == "deleted":
            return SettleResult(False, "deleted", label, breaker_opened=reply.breaker_opened)
        if reply.verdict == "ok" and reply.status is not None:
            return SettleResult(True, reply.status, label, reply.next_due_ms, reply.now_ms,
                                reply.consecutive_failures, reply.breaker_opened, job)
        return SettleResult(False, reply.verdict, label, job=job)

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
        if outcome == "blocked":
            return self._blocked(job, now, occurrence, retry_after_s)
        if outcome == "error":
            retry = job.retry_due_ms(attempt, now, self.settings, retry_after_s)
            if retry is not None:
                return "retrying", retry, occurrence, attempt + 1, True
        next_due = job.next_regular_ms(now, self.settings, self.rng)
        return (LABELS[outcome], next_due, next_due if next_due is not None else occurrence, 1,
                job.kind == "interval")

    def _blocked(self, job: Job, now: int, occurrence: int, wait_s: float | None
                 ) -> tuple[str, int | None, int, int, bool]:
        """Label, next due, occurrence, attempt and relativeness of a blocked run."""
        wait_ms = round((wait_s if wait_s is not None else self.settings.robots_block_s) * 1000)
        if job.kind == "interval":
            assert job.interval_s is not None
            # The interval is added back by next_regular_ms: never sooner than it.
            now += max(0, wait_ms - round(job.interval_s * 1000))
        elif job.kind == "cron":
            now += wait_ms
        next_due = job.next_regular_ms(now, self.settings, self.rng)
        return (LABELS["blocked"], next_due, next_due if next_due is not None else occurrence, 1,
                job.kind == "interval")
