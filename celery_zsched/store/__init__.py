"""The Redis job store: every operation is one Lua script or one pipeline.

:class:`Store` is the facade the rest of the package uses; its methods live in
focused parts, each building on the one before: :mod:`.base` (client,
partitions, layout, calling scripts), :mod:`.reads`, :mod:`.writes`,
:mod:`.hot` (the delivery contract's scripts), :mod:`.batch` (settles in bulk),
and the bookkeeping here (counters, stream cursors, the notifiers' gate, the outbox report).
"""

from __future__ import annotations

import redis

from celery_zsched.core import stream_ids
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
    task_id_for,
)
from celery_zsched.store import scripts
from celery_zsched.store.base import Held, Running, time_ms, unavailable
from celery_zsched.store.batch import Batches
from celery_zsched.store.connection import is_cluster
from celery_zsched.store.hot import START_WAIT_MAX_S, every_line_of, line_of
from celery_zsched.store.robots import SharedResults

__all__ = [
    "START_WAIT_MAX_S", "TASK_ID_NAMESPACE", "ClaimBatch", "Claimed", "Held", "ImportReport",
    "JobInfo", "ReapResult", "Running", "SettleResult", "StartResult", "Store", "every_line_of",
    "line_of", "task_id_for",
]


class Store(Batches, SharedResults):
    """Job definitions and their timing state in Redis.

    Every time is read from the Redis server's clock (``TIME``), never the host's.
    Every method that changes jobs takes ``by`` (an :class:`~.audit.Actor`) and
    ``note``, and records each change in the audit trail (:mod:`.audit`).
    """

    @unavailable
    def report_outbox(self, pending: int, dead: int, oldest_age_ms: int) -> int:
        """Record the Django outbox's counts for ``zsched exporter``; Redis' clock (ms)."""
        return self._call(scripts.OUTBOX_REPORT, self.base, pending=pending, dead=dead,
                          oldest_age_ms=oldest_age_ms)

    @unavailable
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
            now_ms=time_ms(now), pending=int(fields.get("pending") or 0),
            dead=int(fields.get("dead") or 0),
            oldest_age_ms=int(fields.get("oldest_age_ms") or 0),
            reported_ms=int(fields["at"]) if fields.get("at") else None)

    @unavailable
    def notice_gate(self, subject: str, notice: str, event: str, *, window_ms: int,
                    digest_ms: int, threshold: int, cap: int) -> NoticeGate:
        """May this notice go out? The notifiers' rate limit and digest, shared by every
        process (``notify.lua``; keys on the base prefix). ``subject`` "" only claims
        the digest of a window that has ended."""
        return self._call(scripts.NOTIFY, self.base, operation="gate" if subject else "flush",
                          subject=subject, window_ms=window_ms, digest_ms=digest_ms,
                          threshold=threshold, notice=notice, cap=cap, event=event)

    @unavailable
    def count(self, name: str, amount: int = 1, part: int = 0) -> None:
        """Add ``amount`` to lifetime counter ``name`` of partition ``part`` (``zsched stats``
        and the exporter read them)."""
        self.client.hincrby(self.parts[part].counters, name, amount)

    @unavailable
    def drain_cursor(self, part: int = 0) -> str:
        """Stream id of the last settle event of partition ``part`` copied into run
        history ("0" before any)."""
        return str(self.client.get(self.parts[part].drain_cursor) or "0")

    @unavailable
    def advance_drain_cursor(self, cursor: str, part: int = 0) -> bool:
        """Move partition ``part``'s drain cursor forward to ``cursor``; never backwards
        (drains may race)."""
        return self.advance_cursor(self.parts[part].drain_cursor, cursor)

    @unavailable
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
