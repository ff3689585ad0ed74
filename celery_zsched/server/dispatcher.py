"""The long-poll hand-out: one dispatcher per server process.

Pollers wait in line per queue filter, each for up to ``want`` jobs (``?max=``).
The dispatcher claims as many due jobs as the pollers waiting want (one atomic
claim per filter, the same script as beat's), hands each its share in line
order, and otherwise sleeps: until the first
HTTP job due in the future, or until a wake-up on the store's ``http_wake``
channel (an upsert, settle, run-now or reap that made a job due sooner), or
until a new poller arrives. There is no polling loop: an idle server makes
no Redis calls but the reaper's.

A job claimed for a poller that went away meanwhile (timed out, disconnected,
shut down) is released back to the schedule, not lost. While Redis is down,
pollers get :class:`StoreDown` (the gateway answers ``503`` with
``Retry-After``) and the dispatcher probes Redis with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.core.results import Claimed
from celery_zsched.services import signals
from celery_zsched.store import Store
from celery_zsched.store.errors import redis_unavailable

logger = logging.getLogger("celery_zsched.server")
T = TypeVar("T")

#: Most jobs one claim takes for one queue filter.
CLAIM_MAX = 1000
#: Most due jobs per partition a wake-up looks at to pick the filters worth a claim.
PEEK_MAX = 1000
#: How often the server reaps expired leases (HTTP jobs come back after theirs
#: even when no beat runs).
REAP_EVERY_S = 1.0
#: Backoff bounds while Redis is unreachable.
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.5, 10.0


class ShuttingDown(Exception):
    """The server is shutting down: it takes no new polls."""


class StoreDown(Exception):
    """Redis is unreachable; try again after ``retry_after_s``."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"the store is unreachable; retry in {retry_after_s:.0f}s")
        self.retry_after_s = retry_after_s


@dataclass(eq=False)
class Waiter:
    """One long-poll waiting for up to ``want`` jobs of ``queue`` ("" = any)."""

    queue: str
    future: asyncio.Future[list[Claimed]]
    want: int = 1
    #: Withdrawn by its poller: the dispatcher must not hand it a job.
    closed: bool = False


@dataclass
class _Line:
    waiters: deque[Waiter] = field(default_factory=deque)

    def open(self) -> int:
        """Jobs the open waiters want (one each, or their ``max``)."""
        return sum(w.want for w in self.waiters if not w.closed)


@dataclass(frozen=True)
class DueQueues:
    """The HTTP jobs due now, counted per queue field (``None``: no queue)."""

    now_ms: int
    total: int
    by_queue: dict[str | None, int]
    #: The first HTTP job due after now, if any.
    next_due_ms: int | None

    def serves(self, queue: str) -> bool:
        """A claim for filter ``queue`` ("" = any) may find a job."""
        return bool(self.total if queue == "" else self.by_queue.get(queue))


def due_http_queues(store: Store, most: int = PEEK_MAX) -> DueQueues | None:
    """What :class:`DueQueues` says, read from every partition; ``None`` when more than
    ``most`` jobs are due in one (a backlog: then every filter is worth a claim)."""
    with redis_unavailable():
        now = store.now_ms()
        pipe = store.client.pipeline(transaction=False)
        for keys in store.parts:
            pipe.zrangebyscore(keys.http_schedule, "-inf", now, start=0, num=most + 1)
            pipe.zrangebyscore(keys.http_schedule, f"({now}", "+inf", start=0, num=1,
                               withscores=True)
        replies = pipe.execute()
        due_ids = replies[0::2]
        if any(len(ids) > most for ids in due_ids):
            return None
        upcoming = [int(pairs[0][1]) for pairs in replies[1::2] if pairs]
        pipe = store.client.pipeline(transaction=False)
        for keys, ids in zip(store.parts, due_ids, strict=True):
            if ids:
                pipe.hmget(keys.defs, ids)
        definitions = [raw for found in pipe.execute() for raw in found]
    by_queue: dict[str | None, int] = {}
    for raw in definitions:
        if raw is None:
            continue  # deleted meanwhile: a claim drops it
        try:
            queue = json.loads(raw).get("queue")
        except (ValueError, AttributeError):
            queue = None
        by_queue[queue] = by_queue.get(queue, 0) + 1
    return DueQueues(now_ms=now, total=sum(by_queue.values()), by_queue=by_queue,
                     next_due_ms=min(upcoming) if upcoming else None)


class Dispatcher:
    """Hands due HTTP jobs to long-polls; see the module docstring."""

    def __init__(self, store: Store, *, claim_max: int = CLAIM_MAX,
                 run_sync: Callable[..., Any] | None = None, sender: Any = None) -> None:
        self.store = store
        #: Sends ``job_dead_lettered`` for the leases this server's reaps dead-letter.
        self.sender = sender
        self.claim_max = claim_max
        self.lines: dict[str, _Line] = {}
        self.closing = False
        self.down = False
        self.backoff_s = BACKOFF_MIN_S
        self._poke = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: threading.Thread | None = None
        self._stop_listener = threading.Event()
        #: Jobs released because their poller was gone (for tests and logs).
        self.released = 0
        #: Long-polls waiting now (entered, not yet withdrawn).
        self.polls = 0

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the hand-out and reaper tasks and the wake-up listener (in the running loop)."""
        self._loop = asyncio.get_running_loop()
        self._tasks = {asyncio.create_task(self._run(), name="zsched-dispatch"),
                       asyncio.create_task(self._reap_loop(), name="zsched-reap")}
        self._listener = threading.Thread(target=self._listen, name="zsched-wake", daemon=True)
        self._listener.start()

    def begin_shutdown(self) -> None:
        """Take no new polls; answer the waiting ones (``503``). Loop thread only."""
        if self.closing:
            return
        self.closing = True
        for line in self.lines.values():
            for waiter in line.waiters:
                if not waiter.closed and not waiter.future.done():
                    waiter.future.set_exception(ShuttingDown())
        self._poke.set()

    def begin_shutdown_threadsafe(self) -> None:
        """:meth:`begin_shutdown` from any thread (a signal handler)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.begin_shutdown)

    async def close(self) -> None:
        """Stop: waiting polls are answered, a claim in progress finishes and
        releases what nobody took, the listener stops."""
        self.begin_shutdown()
        for task in self._tasks:
            if task.get_name() == "zsched-reap":
                task.cancel()
        # Releases may be started while the hand-out finishes: wait for all.
        while pending := [task for task in self._tasks if not task.done()]:
            await asyncio.gather(*pending, return_exceptions=True)
        self._stop_listener.set()
        if self._listener is not None:
            await asyncio.to_thread(self._listener.join, 5.0)

    # -------------------------------------------------------------- polling
    def enter(self, queue: str, want: int = 1) -> Waiter:
        """Join the line for up to ``want`` jobs of ``queue``; raises
        :class:`ShuttingDown` or :class:`StoreDown`."""
        if self.closing:
            raise ShuttingDown()
        if self.down:
            raise StoreDown(self.backoff_s)
        loop = asyncio.get_running_loop()
        waiter = Waiter(queue, loop.create_future(), max(1, want))
        self.lines.setdefault(queue, _Line()).waiters.append(waiter)
        self.polls += 1
        self._poke.set()
        return waiter

    def withdraw(self, waiter: Waiter) -> list[Claimed]:
        """Leave the line; the jobs handed to ``waiter``, if any (exceptions re-raised).

        After this the dispatcher never hands ``waiter`` anything: the caller
        owns the jobs returned, and must answer with them or :meth:`give_back` them.
        """
        if not waiter.closed:
            self.polls -= 1
        waiter.closed = True
        line = self.lines.get(waiter.queue)
        if line is not None:
            with contextlib.suppress(ValueError):
                line.waiters.remove(waiter)
            if not line.waiters:
                del self.lines[waiter.queue]
        if not waiter.future.done():
            waiter.future.cancel()
            return []
        return waiter.future.result()

    def give_back(self, jobs: Sequence[Claimed]) -> None:
        """Release jobs claimed for pollers that are gone (in the background)."""
        if jobs:
            task = asyncio.get_running_loop().create_task(self._release(list(jobs)))
            # Held until done (close() waits for it), then dropped.
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _release(self, jobs: list[Claimed]) -> None:
        try:
            released = await asyncio.to_thread(self.store.release_http, jobs)
        except StoreUnavailable as exc:
            # Still running under their lease: the reaper brings them back.
            logger.warning("zsched gateway: could not release %d job(s) (%s); they come "
                           "back when their lease ends", len(jobs), exc)
            return
        self.released += released
        logger.info("zsched gateway: released %d job(s) claimed for pollers that left",
                    released)

    # ------------------------------------------------------------ hand-out
    async def _run(self) -> None:
        while not self.closing:
            if self.down:
                await self._probe()
                continue
            wanted = {queue: line.open() for queue, line in self.lines.items() if line.open()}
            if not wanted:
                self._poke.clear()
                await self._poke.wait()
                continue
            self._poke.clear()
            try:
                wake_in = await self._claim_round(wanted)
            except StoreUnavailable as exc:
                self._went_down(exc)
                continue
            except Exception as exc:  # a bug must not leave every poll hanging
                logger.exception("zsched gateway: claim failed")
                self._went_down(exc)
                continue
            if self.lines and any(line.open() for line in self.lines.values()):
                await self._sleep(wake_in)

    async def _claim_round(self, wanted: dict[str, int]) -> float | None:
        """Claim for each filter that has due jobs, and hand out; seconds until the next
        job falls due."""
        soonest: float | None = None
        if len(wanted) > 1:
            # One look at what is due, then a claim only for the filters it can serve:
            # a claim per waiting filter would make each wake-up cost the due jobs
            # times the filters (300 distinct ?queue= polls, 300 claims).
            due = await asyncio.to_thread(due_http_queues, self.store)
            if due is not None:
                wanted = {queue: count for queue, count in wanted.items()
                          if due.serves(queue)}
                # Named queues first: a poll of any queue must not take their jobs.
                wanted = dict(sorted(wanted.items(), key=lambda item: item[0] == ""))
                if due.next_due_ms is not None:
                    soonest = max(0.0, (due.next_due_ms - due.now_ms) / 1000)
        for queue, count in wanted.items():
            limit = min(count, self.claim_max)
            batch = await asyncio.to_thread(self.store.claim_http, limit, queue)
            left = self._hand_out(queue, batch.jobs)
            if left:
                self.give_back(left)
            if len(batch.jobs) == limit < count:
                soonest = 0.0  # more pollers than one claim takes: go again at once
            elif batch.next_due_ms is not None:
                wait = max(0.0, (batch.next_due_ms - batch.now_ms) / 1000)
                soonest = wait if soonest is None else min(soonest, wait)
        return soonest

    def _hand_out(self, queue: str, jobs: Sequence[Claimed]) -> list[Claimed]:
        """Give each open waiter of ``queue``, in line order, up to the jobs it wants;
        the jobs nobody took."""
        line = self.lines.get(queue)
        left = list(jobs)
        while left and line is not None and line.waiters:
            waiter = line.waiters.popleft()
            if waiter.closed or waiter.future.done():
                continue
            share, left = left[:waiter.want], left[waiter.want:]
            waiter.future.set_result(share)
        return left

    async def _sleep(self, seconds: float | None) -> None:
        """Until ``seconds`` pass (``None``: no job is scheduled) or a poke."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._poke.wait(), seconds)

    # -------------------------------------------------------------- outages
    def _went_down(self, exc: Exception) -> None:
        if not self.down:
            logger.error("zsched gateway: Redis is unreachable (%s); answering 503 and "
                         "retrying with backoff", exc)
        self.down = True
        error = StoreDown(self.backoff_s)
        for line in self.lines.values():
            for waiter in line.waiters:
                if not waiter.closed and not waiter.future.done():
                    waiter.future.set_exception(error)

    async def _probe(self) -> None:
        await self._sleep_or_close(self.backoff_s)
        if self.closing:
            return
        try:
            await asyncio.to_thread(self.store.now_ms)
        except StoreUnavailable as exc:
            self.backoff_s = min(self.backoff_s * 2, BACKOFF_MAX_S)
            logger.warning("zsched gateway: Redis still unreachable (%s); next try in %.1fs",
                           exc, self.backoff_s)
            return
        logger.warning("zsched gateway: Redis is reachable again")
        self.down, self.backoff_s = False, BACKOFF_MIN_S

    async def _sleep_or_close(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.closing and time.monotonic() < deadline:
            self._poke.clear()
            await self._sleep(deadline - time.monotonic())

    # ------------------------------------------------------------- reaping
    async def _reap_loop(self) -> None:
        while not self.closing:
            await asyncio.sleep(REAP_EVERY_S)
            if self.down:
                continue
            try:
                result = await asyncio.to_thread(self.store.reap)
            except StoreUnavailable as exc:
                logger.warning("zsched gateway: reap failed (%s)", exc)
                continue
            except Exception:  # keep reaping: leases must keep ending
                logger.exception("zsched gateway: reap failed")
                continue
            if result.redelivered or result.dead:
                logger.info("zsched gateway: %d lease(s) ended unreported: %d back in the "
                            "schedule, %d dead-lettered", result.redelivered + result.dead,
                            result.redelivered, result.dead)
            if result.dead_ids:
                try:  # as beat does after its reap
                    await asyncio.to_thread(signals.after_reap, self.sender, self.store,
                                            result.dead_ids)
                except Exception:  # the reap is done: a signal must never stop reaping
                    logger.exception("zsched gateway: signalling dead letters failed")

    # ------------------------------------------------------------- wake-ups
    def _listen(self) -> None:
        """Thread: turn wake-ups published on the store's channels into pokes."""
        channels = [keys.http_wake for keys in self.store.parts]
        backoff = BACKOFF_MIN_S
        while not self._stop_listener.is_set():
            pubsub: Any = None
            try:
                pubsub = self.store.client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(*channels)
                # Wake-ups published while unsubscribed are lost: look once now.
                self._poke_threadsafe()
                backoff = BACKOFF_MIN_S
                while not self._stop_listener.is_set():
                    if pubsub.get_message(timeout=0.5) is not None:
                        self._poke_threadsafe()
            except Exception as exc:  # any Redis or socket error: resubscribe later
                logger.warning("zsched gateway: wake-up channel lost (%s); resubscribing "
                               "in %.1fs", exc, backoff)
                self._stop_listener.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()

    def _poke_threadsafe(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._poke.set)
