"""One heartbeat thread per worker process: execution leases and worker liveness.

A started occurrence holds a short execution lease (``zsched_lease_s``). The
process running it extends every lease it holds each ``heartbeat_s`` (a third
of the lease) in one script call, so a task may run any length of time while
its worker lives, and a worker that dies is noticed one lease later. The
worker's main process also records itself as alive, which is what tells the
reaper that a message past its delivery deadline was lost rather than only
waiting for workers to come back.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from .errors import StoreUnavailable
from .store import Store

logger = logging.getLogger("celery_zsched")


class Heartbeat:
    """Extends the leases of the occurrences this process runs; optionally beats as a worker."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.worker = ""
        self.queues: tuple[str, ...] = ()
        self._lock = threading.Lock()
        self._running: dict[str, tuple[int, int]] = {}
        self._thread: threading.Thread | None = None

    def track(self, job_id: str, occurrence: int, attempt: int) -> None:
        """Keep this occurrence's lease alive until :meth:`untrack`."""
        with self._lock:
            self._running[job_id] = (occurrence, attempt)
        self._ensure_thread()

    def untrack(self, job_id: str, occurrence: int, attempt: int) -> None:
        """Stop extending this occurrence's lease (it settled or retries)."""
        with self._lock:
            if self._running.get(job_id) == (occurrence, attempt):
                del self._running[job_id]

    def running(self) -> list[tuple[str, int, int]]:
        """The occurrences being kept alive, as (id, occurrence, attempt)."""
        with self._lock:
            return [(job_id, o, a) for job_id, (o, a) in self._running.items()]

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
        """One heartbeat now: extend every lease held, drop those no longer running."""
        running = self.running()
        if not running and not self.worker:
            return
        try:
            gone = self.store.heartbeat(running, self.worker, self.queues)
        except StoreUnavailable as exc:
            logger.warning("zsched: heartbeat failed (%s); %d leases may run out",
                           exc, len(running))
            return
        held = {job_id: (o, a) for job_id, o, a in running}
        for job_id in gone:
            self.untrack(job_id, *held[job_id])

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
