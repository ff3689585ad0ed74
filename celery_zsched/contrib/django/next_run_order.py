"""The job changelist sorted by next run: pages read from the Redis schedule.

The database has no next-run column (Redis keeps due times, and a mirror
would be stale within seconds), so the order comes from Redis in one of two
ways:

* a filtered list of at most :data:`DIRECT_MAX` rows reads the due time of
  each of its ids (one ZMSCORE per partition and 500 ids) and sorts them;
* a longer list walks the schedule sorted sets in due order
  (:func:`celery_zsched.store.due_order.iter_due`) and keeps the ids the filtered
  queryset holds, one SQL ``IN`` query per chunk of ids. Page *n* costs about
  *n* pages of walking: the first page is one chunk. A walk stops after
  :data:`WALK_MAX` schedule entries, so a filter that matches few scheduled
  jobs of a huge fleet cannot keep a request busy for minutes.

Jobs without a due time (in flight, paused, dead-lettered, finished, or not
in Redis) come after the scheduled ones in both directions, by name, as a
database puts nulls last.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from django.db.models import QuerySet

from celery_zsched.contrib.django.conf import get_store
from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.store.due_order import CHUNK, due_times, iter_due

#: Filtered lists up to this many rows are sorted from their own ids' due times.
DIRECT_MAX = 10_000
#: Schedule entries a walk reads at most (per request).
WALK_MAX = 200_000


@dataclass(frozen=True)
class SortedPage:
    """One page of rows in next-run order."""

    rows: list[ZSchedJob]
    #: Schedule entries read when the walk stopped at :data:`WALK_MAX` before
    #: the page was full; 0 when the page is complete.
    truncated_after: int = 0


def _chunks(ids: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(ids)
    while chunk := list(islice(it, size)):
        yield chunk


def _direct(queryset: QuerySet[ZSchedJob], descending: bool) -> list[str]:
    """Every id of a short ``queryset`` in next-run order."""
    store = get_store()
    ids = [str(i) for i in queryset.order_by("name", "job_id").values_list("job_id", flat=True)]
    dues: dict[str, int] = {}
    for chunk in _chunks(ids, CHUNK):
        dues.update((i, due) for i, due in zip(chunk, due_times(store, chunk), strict=True)
                    if due is not None)
    scheduled = sorted(dues, key=lambda i: (dues[i], i), reverse=descending)
    return scheduled + [i for i in ids if i not in dues]


def _unscheduled(queryset: QuerySet[ZSchedJob]) -> Iterator[str]:
    """Ids of ``queryset`` (by name) that have no due time in the schedule."""
    store = get_store()
    ordered = queryset.order_by("name", "job_id").values_list("job_id", flat=True)
    start = 0
    while ids := [str(i) for i in ordered[start:start + CHUNK]]:
        yield from (job_id for job_id, due in zip(ids, due_times(store, ids), strict=True)
                    if due is None)
        start += CHUNK


class _Walk:
    """Chunks of the ids of ``queryset``'s rows in next-run order, from the schedule."""

    def __init__(self, queryset: QuerySet[ZSchedJob], descending: bool) -> None:
        self.queryset = queryset
        self.descending = descending
        self.truncated_after = 0

    def __iter__(self) -> Iterator[list[str]]:
        walked = 0
        for chunk in _chunks(iter_due(get_store(), descending=self.descending), CHUNK):
            if walked >= WALK_MAX:
                self.truncated_after = walked
                return
            walked += len(chunk)
            present = set(self.queryset.filter(job_id__in=chunk)
                          .values_list("job_id", flat=True))
            yield [job_id for job_id in chunk if job_id in present]
        yield from _chunks(_unscheduled(self.queryset), CHUNK)


def next_run_page(queryset: QuerySet[ZSchedJob], offset: int, limit: int, *,
                  descending: bool = False, count: int | None = None) -> SortedPage:
    """Rows ``offset`` .. ``offset + limit`` of ``queryset`` sorted by next run.

    ``count``: the queryset's row count when known (the changelist has it).
    Raises :class:`~celery_zsched.core.errors.StoreUnavailable` if Redis is down.
    """
    if count is not None:
        # No walking on for rows that are not there.
        limit = max(0, min(limit, count - offset))
    if count is not None and count <= DIRECT_MAX:
        page = _direct(queryset, descending)[offset:offset + limit]
        walk = None
    else:
        page, seen, walk = [], 0, _Walk(queryset, descending)
        for chunk in walk if limit else ():
            skip = max(0, offset - seen)
            seen += len(chunk)
            page += chunk[skip:skip + limit - len(page)]
            if len(page) >= limit:
                break
    # A job that moved during a walk may have been read twice.
    unique = list(dict.fromkeys(page))
    rows: dict[Any, ZSchedJob] = queryset.in_bulk(unique, field_name="job_id")
    return SortedPage([rows[job_id] for job_id in unique if job_id in rows],
                      truncated_after=walk.truncated_after if walk is not None else 0)
