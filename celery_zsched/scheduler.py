"""The Celery beat scheduler: ``celery -A proj beat -S celery_zsched``."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from celery.beat import Scheduler

from .appstore import app_timezone
from .beat_entries import job_from_entry
from .config import Settings, redact_url
from .errors import BrokerUnavailable, StoreUnavailable
from .job import Defaults
from .publish import publish_batch, routing_options
from .store import Claimed, Store
from .telemetry import log_event

logger = logging.getLogger("celery_zsched")

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
        self._next_reap_ms: int | None = 0
        self._held_back = False
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

    def setup_schedule(self) -> None:
        """Import ``beat_schedule`` into the store (retried from ``tick`` if Redis is down)."""
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
                self.store.delete(*sorted(gone))
            report = self.store.upsert_many(jobs, stagger=False, static=True)
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
        """Reap (when a lease is due), claim one batch, publish it.

        Returns the seconds until the next due job or deadline, capped by
        ``max_interval``; 0 when the batch was full and more may be due. While
        backpressure holds due jobs back (``queued_bound`` occurrences wait
        unstarted), it polls every ``max_interval``: they wait in the schedule.
        """
        started = time.perf_counter()
        try:
            if not self._static_synced and not self.sync_static():
                return self._backoff()
            reaped = self._maybe_reap()
            batch = self.store.claim(self.settings.batch_size)
            published = self._publish(batch.jobs) if batch.jobs else 0
        except (StoreUnavailable, BrokerUnavailable) as exc:
            logger.warning("zsched: %s", exc)
            return self._backoff()
        self._failures = 0
        self._next_reap_ms = batch.next_lease_ms
        self._clock = (batch.now_ms, time.monotonic())
        level = logging.INFO if batch.jobs or reaped else logging.DEBUG
        log_event("poll_stats", level, promoted=published, claimed=len(batch.jobs),
                  reaped=reaped, tick_ms=round((time.perf_counter() - started) * 1000, 3))
        if len(batch.jobs) >= self.settings.batch_size:
            return 0.0
        cap = float(self.max_interval or 1)
        held = batch.room <= 0 and batch.next_due_ms is not None \
            and batch.next_due_ms <= batch.now_ms
        if held != self._held_back:
            self._held_back = held
            log_event("backpressure", logging.WARNING if held else logging.INFO, on=held,
                      bound=self.settings.queued_bound)
        if held:
            return cap
        wake = [t for t in (batch.next_due_ms, batch.next_lease_ms) if t is not None]
        if not wake:
            return cap
        wait: float = (min(wake) - batch.now_ms) / 1000.0
        return max(0.0, min(wait, cap))

    def _maybe_reap(self) -> int:
        redis_ms, mono = self._clock
        estimate = redis_ms + (time.monotonic() - mono) * 1000
        if self._next_reap_ms is None or self._next_reap_ms > estimate:
            return 0
        res = self.store.reap(self.settings.batch_size)
        if res.total or res.converted:
            log_event("reaped", logging.WARNING, redelivered=res.redelivered, dead=res.dead,
                      lost=res.lost, converted=res.converted, ids=list(res.ids[:20]))
        elif res.held:
            log_event("delivery_held", logging.INFO, held=res.held)
        return res.total

    def _backoff(self) -> float:
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
                                  event={"lateness_ms": late})
                log_event("job_misfire", job_id=claimed.job.id, lateness_ms=late)
                skipped += 1
            else:
                to_send.append(claimed)
        try:
            publish_batch(self.app, self.producer, to_send)
        except Exception as exc:
            # The broker refused: give the jobs back now rather than waiting
            # out their leases. If Redis is down too, the leases still expire.
            logger.error("zsched: publishing %d jobs failed: %s", len(to_send), exc)
            self.store.release(to_send)
            self.__dict__.pop("producer", None)
            raise BrokerUnavailable(f"broker publish failed: {exc}") from exc
        # The reaper asks whether a worker consumes this queue before it
        # presumes a message lost (one more round trip per batch).
        self.store.routed([(c, queue) for c in to_send if (queue := self._queue_of(c))])
        return len(to_send)

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
        if "store" in self.__dict__:
            self.store.client.close()
