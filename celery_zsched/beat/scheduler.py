"""The Celery beat scheduler: ``celery -A proj beat -S celery_zsched``."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cached_property
from typing import Any

from celery.beat import Scheduler

from celery_zsched.beat.publish import publish_batch, routing_options
from celery_zsched.beat.unacked import UnackedSweep
from celery_zsched.beat.visits import Visits
from celery_zsched.config import Settings, redact_url
from celery_zsched.core.audit import Actor
from celery_zsched.core.errors import BrokerUnavailable, StoreUnavailable
from celery_zsched.core.job import Defaults
from celery_zsched.core.results import merge_batches
from celery_zsched.core.telemetry import log_event
from celery_zsched.services import extensions, signals, tracing
from celery_zsched.services.appstore import app_timezone
from celery_zsched.services.beat_entries import job_from_entry
from celery_zsched.services.extensions import BeatObserver
from celery_zsched.store import ClaimBatch, Claimed, Store

logger = logging.getLogger("celery_zsched")
#: Who changes the jobs of the ``beat_schedule`` setting: beat, following the config.
STATIC_ACTOR = Actor("reconcile", "beat_schedule")

#: Longest wait between retries while Redis is unreachable.
MAX_BACKOFF_S = 30.0


class ZSchedScheduler(Scheduler):
    """Claims due jobs from Redis and publishes them, in batches.

    Any number of these may run against one store: each occurrence is claimed
    by exactly one of them. Nothing is loaded into memory but the batch at hand.
    """

    #: Upper bound of a tick's sleep. A job added with an earlier due time than
    #: the one beat is sleeping towards waits at most this long.
    max_interval = 1

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self._static_synced = False
        self._failures = 0
        self._held_back = False
        self._announced = -math.inf
        self._queues: dict[tuple[str, str | None, str | None], str | None] = {}
        # Redis clock at the last claim, and the monotonic clock then: enough to
        # know when a lease is due without asking Redis on every tick.
        self._clock = (0, 0.0)
        super().__init__(app, *args, **kwargs)

    # -------------------------------------------------------------- set-up
    @cached_property
    def settings(self) -> Settings:
        """``zsched_*`` settings, read on first use (never at construction)."""
        return Settings.from_app(self.app)

    @cached_property
    def store(self) -> Store:
        """The Redis store (connects on first command)."""
        return Store.from_settings(self.settings, app_timezone(self.app))

    @cached_property
    def visits(self) -> Visits:
        """Which partitions each tick claims from (one, unless ``zsched_partitions``)."""
        return Visits(self.store.partitions)

    @cached_property
    def unacked(self) -> UnackedSweep:
        """The sweep of a Redis broker's unacked index for what dead workers took unrecorded."""
        return UnackedSweep(self.app, self.store, lambda: list(self._queues.values()))

    @cached_property
    def metrics(self) -> BeatObserver:
        """What observes the ticks (the metrics, with ``zsched_metrics_port``); a no-op
        when nothing does."""
        return extensions.beat_observer(self.settings)

    @cached_property
    def beat_name(self) -> str:
        """This beat, as ``zsched repartition`` sees it among the live processes."""
        return f"beat@{socket.gethostname()}:{os.getpid()}"

    def setup_schedule(self) -> None:
        """Import ``beat_schedule`` into the store (retried from ``tick`` if Redis is down),
        and connect the notifiers the settings switch on."""
        extensions.start(self.app, "beat")
        self.sync_static()

    def sync_static(self) -> bool:
        """Upsert static entries, and delete static jobs that left the config.

        Dynamic jobs (CLI, import, Django) are never touched.
        """
        defaults = Defaults.from_settings(self.settings, app_timezone(self.app))
        entries = dict(self.app.conf.beat_schedule or {})
        jobs = [job_from_entry(name, dict(entry), defaults) for name, entry in entries.items()]
        try:
            gone = self.store.static_ids() - {job.id for job in jobs}
            if gone:
                self.store.delete(*sorted(gone), by=STATIC_ACTOR)
            report = self.store.upsert_many(jobs, stagger=False, static=True, by=STATIC_ACTOR)
        except StoreUnavailable as exc:
            logger.warning("zsched: cannot import beat_schedule yet: %s", exc)
            return False
        self._static_synced = True
        log_event("static_synced", entries=len(jobs), created=report.created,
                  removed=len(gone))
        return True

    def get_schedule(self) -> dict[str, Any]:
        # The schedule lives in Redis; beat's in-memory heap stays empty.
        return {}

    def set_schedule(self, schedule: Any) -> None:
        pass

    schedule = property(get_schedule, set_schedule)

    @property
    def info(self) -> str:
        # Shown in beat's banner; must not connect.
        settings = Settings.from_app(self.app)
        return f"    . zsched -> {redact_url(settings.redis_url)} prefix={settings.key_prefix}"

    # ---------------------------------------------------------------- tick
    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Reap (when a lease is due), claim a batch, publish it.

        While batches come back full, it goes on for up to ``max_interval``
        seconds, each claim overlapping the publish of the batch before. Returns
        the seconds until the next due job or deadline, capped by
        ``max_interval``; 0 when the last batch was full and more may be due. While
        backpressure holds due jobs back (``queued_bound`` occurrences wait
        unstarted), it polls every ``max_interval``: they wait in the schedule.
        """
        started = time.perf_counter()
        claimed = published = paced = queue_held = 0
        try:
            self._announce()
            if not self._static_synced and not self.sync_static():
                return self._backoff()
            reaped = self._maybe_reap()
            if self.unacked.due():
                reaped += self.unacked.sweep()
            plan = self.visits.plan(self._redis_now(), self.settings.batch_size)
            parts = len(plan)
            batches = self._claim(plan)
            while True:
                self.visits.record(plan, batches)
                batch = merge_batches(batches.values())
                self._clock = (batch.now_ms, time.monotonic())
                following = None
                if (self.visits.any_full and batch.jobs
                        and time.perf_counter() - started < float(self.max_interval or 1)):
                    # More is due: Redis runs the next claim while this batch is published.
                    plan = self.visits.plan(self._redis_now(), self.settings.batch_size)
                    following = self._claimer.submit(self._claim, plan)
                count = self._publish_claimed(batch.jobs, following)
                self.metrics.tick(batch.jobs, count)
                claimed += len(batch.jobs)
                published += count
                paced += batch.held
                queue_held += batch.queue_held
                if following is None:
                    break
                batches = following.result()
        except (StoreUnavailable, BrokerUnavailable) as exc:
            logger.warning("zsched: %s", exc)
            return self._backoff()
        self._failures = 0
        level = logging.INFO if claimed or paced or reaped else logging.DEBUG
        log_event("poll_stats", level, promoted=published, claimed=claimed,
                  paced=paced, queue_held=queue_held, reaped=reaped, partitions=parts,
                  tick_ms=round((time.perf_counter() - started) * 1000, 3))
        if self.visits.any_full:
            return 0.0
        cap = float(self.max_interval or 1)
        held = self.visits.held
        if held != self._held_back:
            self._held_back = held
            log_event("backpressure", logging.WARNING if held else logging.INFO, on=held,
                      bound=self.settings.queued_bound)
        if held:
            return cap
        wake = self.visits.next_wake_ms()
        if wake is None:
            return cap
        wait: float = (wake - self._redis_now()) / 1000.0
        return max(0.0, min(wait, cap))

    def _claim(self, plan: dict[int, int]) -> dict[int, ClaimBatch]:
        with self.metrics.time_claim():
            return self.store.claim_parts(plan)

    @cached_property
    def _claimer(self) -> ThreadPoolExecutor:
        """The thread that claims the next batch while beat publishes one."""
        return ThreadPoolExecutor(1, thread_name_prefix="zsched-claim")

    def _publish_claimed(self, jobs: list[Claimed],
                         following: Future[dict[int, ClaimBatch]] | None) -> int:
        """Publish one claimed batch; if that fails, give the claim in flight back too."""
        try:
            if not jobs:  # an idle tick publishes nothing: not a 0 s sample
                return 0
            with self.metrics.time_publish():
                return self._publish(jobs)
        except BaseException:
            if following is not None:
                with contextlib.suppress(Exception):
                    taken = [c for b in following.result().values() for c in b.jobs]
                    if taken:
                        self.store.release(taken)
            raise

    def _redis_now(self) -> int:
        """The Redis clock now, estimated from the last claim and the monotonic clock."""
        redis_ms, mono = self._clock
        return int(redis_ms + (time.monotonic() - mono) * 1000)

    def _announce(self) -> None:
        """Tell ``zsched repartition`` this beat is alive (every heartbeat period)."""
        if time.monotonic() - self._announced >= self.settings.heartbeat_s:
            self.store.announce(self.beat_name)
            self._announced = time.monotonic()

    def _maybe_reap(self) -> int:
        parts = self.visits.lease_due(self._redis_now())
        if not parts:
            return 0
        res = self.store.reap(self.settings.batch_size, parts=parts)
        self.visits.reaped(parts)
        if res.dead_ids:
            try:
                signals.after_reap(self.app, self.store, res.dead_ids)
            except StoreUnavailable as exc:  # the reap is done: do not fail the tick
                logger.warning("zsched: dead letters not signalled: %s", exc)
            except Exception:
                logger.exception("zsched: signalling %d dead letters failed", len(res.dead_ids))
        if res.total or res.converted:
            log_event("reaped", logging.WARNING, redelivered=res.redelivered, dead=res.dead,
                      lost=res.lost, orphaned=res.orphaned, unpublished=res.unpublished,
                      converted=res.converted, ids=list(res.ids[:20]))
        elif res.held:
            log_event("delivery_held", logging.INFO, held=res.held)
        return res.total

    def _backoff(self) -> float:
        self.metrics.failure()
        self._failures += 1
        delay: float = min(MAX_BACKOFF_S, 0.5 * 2 ** min(int(self._failures), 10))
        logger.warning("zsched: unavailable (attempt %d); retrying in %.1fs",
                       self._failures, delay)
        return delay

    def _publish(self, jobs: Sequence[Claimed]) -> int:
        to_send: list[Claimed] = []
        skipped = 0
        for claimed in jobs:
            grace = claimed.job.misfire_grace_ms(self.settings)
            late = claimed.promoted_ms - claimed.due_ms
            # Only a first fire can misfire: a retry, or a redelivery of a
            # crashed or lost occurrence, must run (nothing lost in a crash).
            if grace and late > grace and claimed.attempt == 1 and claimed.deliveries == 1:
                self.store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "skip",
                                  event={"lateness_ms": late}, delivery=claimed.deliveries)
                log_event("job_misfire", job_id=claimed.job.id, lateness_ms=late)
                skipped += 1
            else:
                to_send.append(claimed)
        spans = self._spans(to_send)
        try:
            publish_batch(self.app, self.producer, to_send,
                          None if spans is None else spans.headers)
        except Exception as exc:
            if spans is not None:
                spans.end(exc)
            # The broker refused: give the jobs back now rather than waiting
            # out their leases. If Redis is down too, the leases still expire.
            logger.error("zsched: publishing %d jobs failed: %s", len(to_send), exc)
            self.store.release(to_send)
            self.__dict__.pop("producer", None)
            raise BrokerUnavailable(f"broker publish failed: {exc}") from exc
        if spans is not None:
            spans.end()
        # Confirms the publish (the occurrences leave the short publish deadline
        # for the delivery deadline), and tells the reaper which queue's workers
        # to ask about before it presumes a message lost. If this fails, the
        # publish deadline brings them back and the start drops the second copy.
        self.store.routed([(c, self._queue_of(c) or "") for c in to_send])
        return len(to_send)

    @staticmethod
    def _spans(jobs: Sequence[Claimed]) -> tracing.PublishSpans | None:
        """The publish spans of ``jobs`` (``zsched_tracing``), or ``None``."""
        tracer = tracing.active()
        if tracer is None:
            return None
        try:
            return tracer.publishing(jobs)
        except Exception:  # tracing must never stop a publish
            logger.exception("zsched: tracing %d messages failed", len(jobs))
            return None

    def _queue_of(self, claimed: Claimed) -> str | None:
        """The queue ``claimed`` was published to, as Celery's router resolves it."""
        job = claimed.job
        key = (job.task, job.queue, job.routing_key)
        if key not in self._queues:
            try:
                route = self.app.amqp.router.route(routing_options(claimed), job.task)
                queue = route.get("queue")
                self._queues[key] = str(queue.name) if queue is not None else None
            except Exception:  # an unroutable task is reported by the publish itself
                self._queues[key] = None
        return self._queues[key]

    def close(self) -> None:
        super().close()
        if "_claimer" in self.__dict__:
            self._claimer.shutdown()
        extensions.stop("beat")
        if "unacked" in self.__dict__:
            self.unacked.close()
        if "store" in self.__dict__:
            with contextlib.suppress(StoreUnavailable):
                self.store.announce(self.beat_name, gone=True)
            self.store.client.close()
