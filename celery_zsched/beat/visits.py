"""Which partitions a beat claims from on each tick, and how many jobs from each.

A beat keeps, per partition, what the last claim there said: when its next job
falls due, when its next lease or delivery deadline ends, and whether the claim
came back full. Every tick claims from every partition, in one pipeline (one
round trip per Redis node, the nodes in parallel): the partitions with due work
share the batch evenly, and each of the others is asked for one job, which is
enough to see a job made due early (by an edit or ``run_now``) at once and to
learn its next due time. An idle tick thus costs one script per partition,
whatever the number of jobs.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from celery_zsched.core.results import ClaimBatch


@dataclass
class PartitionView:
    """What one partition's last claim told this beat (times on the Redis clock)."""

    next_due_ms: int | None = None
    next_lease_ms: int | None = None
    seen_ms: int | None = None
    #: The last claim took all it was allowed: more is probably due.
    full: bool = False
    #: The last claim found the backpressure bound reached with jobs due.
    held: bool = False


class Visits:
    """The plan of each tick's claims over the partitions of one store."""

    def __init__(self, count: int, rng: random.Random | None = None) -> None:
        self.views = [PartitionView() for _ in range(count)]
        # Beats start at different partitions: when a batch is smaller than the
        # number of partitions worth visiting, each beat serves others first.
        self._offset = (rng or random.Random()).randrange(count)

    def plan(self, now_ms: int, limit: int) -> dict[int, int]:
        """Partition -> most jobs to claim there, for a tick at ``now_ms`` (estimated)."""
        count = len(self.views)
        order = [(self._offset + k) % count for k in range(count)]
        self._offset = (self._offset + 1) % count
        hot = [i for i in order if self._hot(self.views[i], now_ms)] or order
        share, extra = divmod(limit, len(hot))
        plan = dict.fromkeys(order, 1)
        plan.update({i: max(1, share + (k < extra)) for k, i in enumerate(hot)})
        return plan

    @staticmethod
    def _hot(view: PartitionView, now_ms: int) -> bool:
        """Whether the partition probably has due work it may release now."""
        if view.seen_ms is None or view.full:
            return True
        return view.next_due_ms is not None and view.next_due_ms <= now_ms and not view.held

    def record(self, plan: Mapping[int, int], batches: Mapping[int, ClaimBatch]) -> None:
        """Remember what the claims of ``plan`` answered."""
        for i, batch in batches.items():
            due_now = batch.next_due_ms is not None and batch.next_due_ms <= batch.now_ms
            self.views[i] = PartitionView(
                next_due_ms=batch.next_due_ms, next_lease_ms=batch.next_lease_ms,
                seen_ms=batch.now_ms, full=batch.taken >= plan[i],
                held=batch.room <= 0 and due_now)

    def lease_due(self, now_ms: int) -> list[int]:
        """Partitions where a lease or delivery deadline has passed: reap there."""
        return [i for i, v in enumerate(self.views)
                if v.next_lease_ms is not None and v.next_lease_ms <= now_ms]

    def reaped(self, parts: list[int]) -> None:
        """Their deadlines are handled; this tick's claim there tells the next ones."""
        for i in parts:
            self.views[i].next_lease_ms = None

    @property
    def any_full(self) -> bool:
        """Some partition gave all it was asked for: claim again without sleeping."""
        return any(v.full for v in self.views)

    @property
    def held(self) -> bool:
        """Backpressure holds due jobs back in some partition."""
        return any(v.held for v in self.views)

    def next_wake_ms(self) -> int | None:
        """The earliest due time or deadline this beat knows of, in any partition."""
        times = [t for v in self.views for t in (v.next_due_ms, v.next_lease_ms)
                 if t is not None]
        return min(times, default=None)
