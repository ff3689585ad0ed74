"""One heartbeat thread per worker process: execution leases, held messages, liveness.

A started occurrence holds a short execution lease (``zsched_lease_s``). The
process running it extends every lease it holds each ``heartbeat_s`` (a third
of the lease) in one script call, so a task may run any length of time while
its worker lives, and a worker that dies is noticed one lease later. Each
lease is named by the fence its start returned, so a process whose lease
lapsed while it stalled cannot extend the lease of the worker that runs the
occurrence now.

The worker's main process also holds the messages it received and has not
started (its prefetch, countdowns it waits out), under the same lease, kept
alive by the same beats: when the worker dies, the reaper republishes what it
held one lease later, instead of after the broker's visibility timeout. A
message taken less than a beat before the death has no hold yet: on a Redis
broker beat finds it in the broker's unacked index a lease later
(:mod:`celery_zsched.beat.unacked`). Holding costs no round trip of its own,
except before a message is acknowledged unstarted (:mod:`celery_zsched.worker.holds`),
and even that one is sent ahead of its reply on a Redis broker.
And the worker records itself as alive, which is what tells the reaper that a
message past its delivery deadline was lost rather than only waiting for
workers to come back.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.store import Held, Store

logger = logging.getLogger("celery_zsched")
#: Most holds one :meth:`Heartbeat.hold_now` records in its round trip.
HOLD_BATCH = 200
#: Longest a received message's hold waits for the holds of the messages received
#: after it, to go out in one script call with them (:meth:`Heartbeat.hold`). A
#: worker killed meanwhile leaves the message to beat's sweep of the broker's
#: unacked index, as one killed while the hold was on the wire does; an
#: acceptance sends it at once. Short against the lease (30 s), and long against
#: the gap between receipts when the pool is behind (about a millisecond for
#: tasks that do nothing): so several go together.
HOLD_SOON_S = 0.01
#: Most holds that wait for one another (:data:`HOLD_SOON_S`).
HOLD_SOON_BATCH = 32
#: Runs ``callback`` after ``delay`` seconds in the caller's thread (the worker's
#: event loop: ``kombu.asynchronous.Hub.call_later``).
Later = Callable[[float, Callable[[], None]], object]


class Heartbeat:
    """Extends the leases of what this process runs; holds what it received; beats as a worker."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.worker = ""
        self.queues: tuple[str, ...] = ()
        #: The name holds are recorded under, before the worker announced itself.
        self.holder = ""
        self._lock = threading.Lock()
        self._running: dict[str, tuple[int, int, int | None]] = {}
        # Keyed by the worker's request object: a message that is done (run,
        # dropped or rejected) is no longer referenced, and so no longer held.
        self._held: weakref.WeakKeyDictionary[Any, Held] = weakref.WeakKeyDictionary()
        #: The requests whose holds Redis has recorded (a beat or :meth:`hold_now`).
        self._recorded: weakref.WeakSet[Any] = weakref.WeakSet()
        #: The requests whose holds were sent, or wait to be, and whose replies are unread.
        self._sending: weakref.WeakSet[Any] = weakref.WeakSet()
        #: Holds that wait for the ones received after them (:data:`HOLD_SOON_S`).
        self._unsent: list[tuple[Any, Held]] = []
        self._thread: threading.Thread | None = None

    def track(self, job_id: str, occurrence: int, attempt: int,
              fence: int | None = None) -> None:
        """Keep this occurrence's lease alive until :meth:`untrack` (``fence``: its start's)."""
        with self._lock:
            self._running[job_id] = (occurrence, attempt, fence)
        self._ensure_thread()

    def untrack(self, job_id: str, occurrence: int, attempt: int) -> None:
        """Stop extending this occurrence's lease (it settled or retries)."""
        with self._lock:
            if self._running.get(job_id, (None, None))[:2] == (occurrence, attempt):
                del self._running[job_id]

    def running(self) -> list[tuple[str, int, int] | tuple[str, int, int, int]]:
        """The occurrences being kept alive, as (id, occurrence, attempt[, fence])."""
        with self._lock:
            return [(job_id, o, a) if f is None else (job_id, o, a, f)
                    for job_id, (o, a, f) in self._running.items()]

    def hold(self, request: Any, row: Held, holder: str, *, record: bool = False,
             later: Later | None = None) -> None:
        """Hold the message of ``request`` (id, occurrence, attempt, delivery, task) for as
        long as the request object lives, from the next beat on (``record``: from now,
        sent without waiting for the reply, which :meth:`hold_now` reads if it needs it).

        ``later`` (the event loop's timer): a hold to record waits up to
        :data:`HOLD_SOON_S` for the holds of the messages received after it, and
        goes out in one script call with them.
        """
        with self._lock:
            self._held[request] = row
            self.holder = self.holder or holder
        self._ensure_thread()
        if not record:
            return
        with self._lock:
            self._sending.add(request)
            self._unsent.append((request, row))
            first, full = len(self._unsent) == 1, len(self._unsent) >= HOLD_SOON_BATCH
        if later is None or full:
            self.send_holds()
        elif first:
            later(HOLD_SOON_S, self.send_holds)

    def send_holds(self) -> None:
        """Send the holds that wait (:meth:`hold`) in one call, without waiting for the
        reply."""
        with self._lock:
            batch, self._unsent = self._unsent, []
        if not batch:
            return

        def recorded(rows: Sequence[Held], gone: list[str] | None) -> None:
            covered = {id(row) for row in rows}  # a partition's share of the batch
            with self._lock:
                for request, row in batch:
                    if id(row) not in covered:
                        continue
                    self._sending.discard(request)
                    if gone is None:
                        continue  # no reply: a beat or hold_now records it
                    if row[0] in gone:
                        self._held.pop(request, None)
                    else:
                        self._recorded.add(request)
        try:
            self.store.hold_soon([row for _, row in batch], self.worker or self.holder,
                                 recorded)
        except StoreUnavailable:
            with self._lock:
                for request, _ in batch:
                    self._sending.discard(request)  # the next beat tries

    def hold_now(self, request: Any, row: Held, holder: str) -> None:
        """:meth:`hold`, and record the hold in Redis now unless a beat has already.

        For a message about to be acknowledged before it starts: from then on
        only the hold tells the reaper about it. Every other message this
        process holds and Redis does not know of yet (the prefetch received
        since) is recorded in the same round trip, so the next ones to be
        acknowledged need none: one round trip per prefetch, not per message.
        Redis unreachable: logged, and the message goes on (its start needs
        Redis too, and retries).
        """
        with self._lock:
            self._held[request] = row
            self.holder = self.holder or holder
            if request in self._recorded:
                return
            sent = request in self._sending
            waits = any(each is request for each, _ in self._unsent)
        if waits:  # still waiting for the holds received after it: they go with it now
            self.send_holds()
        if sent:  # its hold went out on receipt: the reply is all but certainly back
            self.store.collect()
        with self._lock:
            if request in self._recorded:
                return
            batch = [(each, held) for each, held in self._held.items()
                     if each not in self._recorded][:HOLD_BATCH - 1]
            if all(each is not request for each, _ in batch):
                batch.append((request, row))
        self._ensure_thread()
        try:
            gone = set(self.store.hold([held for _, held in batch], self.worker or self.holder))
        except StoreUnavailable as exc:
            logger.warning("zsched: could not hold %s before acknowledging it (%s); if this "
                           "worker dies before it starts, it waits for its delivery deadline",
                           row[0], exc)
            return
        with self._lock:
            for each, held in batch:
                if held[0] in gone:
                    self._held.pop(each, None)
                else:
                    self._recorded.add(each)

    def unhold(self, job_id: str) -> None:
        """This process started (or dropped) ``job_id``'s message: it holds it no more."""
        with self._lock:
            if not self._held:  # a pool child holds nothing: its parent does
                return
            for request, row in list(self._held.items()):
                if row[0] == job_id:
                    del self._held[request]

    def held(self) -> list[Held]:
        """The messages this process holds, unstarted."""
        with self._lock:
            return list(self._held.values())

    def announce(self, worker: str, queues: tuple[str, ...] = ()) -> None:
        """Record ``worker`` and the ``queues`` it consumes as alive on every beat, from now."""
        self.worker, self.queues = worker, queues
        self.beat()
        self._ensure_thread()

    def retire(self) -> None:
        """Stop announcing the worker (clean shutdown); running leases are still kept."""
        worker, self.worker, self.queues = self.worker, "", ()
        if worker:
            try:
                self.store.forget_worker(worker)
            except StoreUnavailable as exc:
                logger.warning("zsched: could not deregister worker %s: %s", worker, exc)

    def beat(self) -> None:
        """One heartbeat now: extend every lease held and every hold, drop what moved on."""
        self.store.collect()  # replies of holds sent ahead that no acceptance read
        running = self.running()
        with self._lock:
            holds = list(self._held.items())
        held = [row for _, row in holds]
        if not running and not held and not self.worker:
            return
        try:
            gone, unheld = self.store.beat(running, held, self.worker or self.holder,
                                           self.queues)
        except StoreUnavailable as exc:
            logger.warning("zsched: heartbeat failed (%s); %d leases and %d holds may run out",
                           exc, len(running), len(held))
            return
        with self._lock:
            self._recorded.update(request for request, _ in holds)
        by_id = {row[0]: row for row in running}
        for job_id in gone:
            self.untrack(job_id, by_id[job_id][1], by_id[job_id][2])
        for job_id in unheld:
            self.unhold(job_id)

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._loop, name="zsched-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        interval = self.store.settings.heartbeat_s
        while True:
            time.sleep(interval)
            try:
                self.beat()
            except Exception:  # the thread must outlive any one bad beat
                logger.exception("zsched: heartbeat error")


_lock = threading.Lock()
_beats: dict[int, Heartbeat] = {}


def heartbeat_for(app: Any, store: Store) -> Heartbeat:
    """The heartbeat of this process for ``app`` (created on first use)."""
    with _lock:
        beat = _beats.get(id(app))
        if beat is None:
            beat = _beats[id(app)] = Heartbeat(store)
        return beat


def _forget_after_fork() -> None:
    # A forked pool child inherits the parent's tracking but not its thread,
    # and must never announce the parent's worker name: start afresh.
    global _lock
    _lock = threading.Lock()
    _beats.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
