"""Jobs in due-time order, a chunk at a time: what "sort by next run" reads.

The schedule sorted sets already hold every scheduled job by due time, so a
list sorted by next run walks them (merged over the partitions) instead of
asking a database that has no next-run column. Walking is lazy: a caller that
wants the first page reads one chunk per partition. Jobs with no due time
(in flight, paused, dead, finished, or not in Redis) are not in the schedule;
:func:`due_times` tells a caller which of its ids those are.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

from celery_zsched.store import Store
from celery_zsched.store.errors import redis_unavailable
from celery_zsched.store.keys import Keys, due_of

#: Schedule entries read per partition and round trip.
CHUNK = 500


def _walk(store: Store, keys: Keys, descending: bool, chunk: int
          ) -> Iterator[tuple[float, str]]:
    start = 0
    while True:
        with redis_unavailable():
            rows = store.client.zrange(keys.schedule, start, start + chunk - 1,
                                       desc=descending, withscores=True)
        for job_id, score in rows:
            yield float(score), str(job_id)
        if len(rows) < chunk:
            return
        start += chunk


def iter_due(store: Store, *, descending: bool = False, chunk: int = CHUNK) -> Iterator[str]:
    """Every scheduled job id, earliest due first (latest first if ``descending``).

    Ties are broken by id. Entries that move while the walk is under way may be
    seen twice or not at all, as with any paged read of a live schedule.
    Raises :class:`StoreUnavailable` if Redis cannot be reached.
    """
    with redis_unavailable():
        if not store.layout_checked:
            store.check_layout()
    walks = [_walk(store, keys, descending, chunk) for keys in store.parts]
    for _, job_id in heapq.merge(*walks, reverse=descending):
        yield job_id


def due_times(store: Store, ids: Sequence[str]) -> list[int | None]:
    """The due time (ms) of each of ``ids``, ``None`` for those not in the schedule.

    One pipeline: one ZMSCORE per partition.
    """
    scores = store.per_job(
        ids, lambda pipe, keys, members: pipe.zmscore(keys.schedule, members))
    return [None if score is None else due_of(score) for score in scores]
