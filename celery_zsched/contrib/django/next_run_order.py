"""The job changelist sorted by next run: pages read from the Redis schedule.

The database has no next-run column (Redis keeps due times, and a mirror
would be stale within seconds), so the sort walks the schedule sorted sets in
due order (:func:`celery_zsched.due_order.iter_due`) and keeps the jobs the
changelist's filtered queryset holds, one SQL ``IN`` query per chunk of ids.
Page *n* costs about *n* pages of walking: the first page is one chunk.

Jobs without a due time (in flight, paused, dead-lettered, finished, or not
in Redis) come after the scheduled ones in both directions, by name, as a
database puts nulls last.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from django.db.models import QuerySet

from celery_zsched.due_order import CHUNK, due_times, iter_due

from .conf import get_store
from .models import ZSchedJob


def _chunks(ids: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(ids)
    while chunk := list(islice(it, size)):
        yield chunk


def _unscheduled(queryset: QuerySet[ZSchedJob]) -> Iterator[str]:
    """Ids of ``queryset`` (by name) that have no due time in the schedule."""
    store = get_store()
    ordered = queryset.order_by("name", "job_id").values_list("job_id", flat=True)
    start = 0
    while ids := [str(i) for i in ordered[start:start + CHUNK]]:
        yield from (job_id for job_id, due in zip(ids, due_times(store, ids), strict=True)
                    if due is None)
        start += CHUNK


def _matching(queryset: QuerySet[ZSchedJob], descending: bool) -> Iterator[list[str]]:
    """Chunks of the ids of ``queryset``'s rows, in next-run order."""
    for chunk in _chunks(iter_due(get_store(), descending=descending), CHUNK):
        present = set(queryset.filter(job_id__in=chunk).values_list("job_id", flat=True))
        yield [job_id for job_id in chunk if job_id in present]
    yield from _chunks(_unscheduled(queryset), CHUNK)


def next_run_page(queryset: QuerySet[ZSchedJob], offset: int, limit: int, *,
                  descending: bool = False) -> list[ZSchedJob]:
    """Rows ``offset`` .. ``offset + limit`` of ``queryset`` sorted by next run.

    Raises :class:`~celery_zsched.errors.StoreUnavailable` if Redis is down.
    """
    page: list[str] = []
    seen = 0
    for chunk in _matching(queryset, descending):
        skip = max(0, offset - seen)
        seen += len(chunk)
        page += chunk[skip:skip + limit - len(page)]
        if len(page) >= limit:
            break
    # A job that moved during the walk may have been read twice.
    unique = list(dict.fromkeys(page))
    rows: dict[Any, ZSchedJob] = queryset.in_bulk(unique, field_name="job_id")
    return [rows[job_id] for job_id in unique if job_id in rows]
