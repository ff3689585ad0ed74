"""Run history, copied in bulk from the Redis settle stream: no database write on the hot path.

Every settle appends one entry to a capped Redis stream (``settle.lua``).
:func:`drain` copies new entries into :class:`ZSchedRun` rows with
``bulk_create``, refreshes the runtime mirror of the jobs concerned with
``bulk_update``, then advances a cursor kept in Redis. Each entry's stream id
is unique in the table, so draining the same entries twice (a crash between
the insert and the cursor write, or two drains at once) adds nothing.

The stream holds about ``CELERY_ZSCHED_EVENTS_MAXLEN`` entries (100,000 by
default): drain at least that often (the ``drain_history`` task every minute
is plenty) or history has gaps. The mirror fields stay right regardless,
since they are read from the jobs' Redis state, not summed from events.

An entry that cannot become a row (a time or count out of any database's
range, written by a careless or hostile worker) is skipped with one log line
and counted (``history_skipped``: ``zsched stats``, the exporter's
``zsched_history_skipped_events``): the cursor moves past it, so one bad
event never stops the run history.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone as dj_timezone

from celery_zsched.contrib.django.audit import drain_changes
from celery_zsched.contrib.django.conf import get_django_settings, get_store
from celery_zsched.contrib.django.models import (
    MIRROR_FIELDS,
    ZSchedJob,
    ZSchedRun,
    mirror_values,
    to_db_datetime,
)
from celery_zsched.contrib.django.sync import IN_CHUNK, batched
from celery_zsched.core import stream_ids
from celery_zsched.store import Store
from celery_zsched.store.errors import redis_unavailable

logger = logging.getLogger("celery_zsched.django")

#: Stream entries read per round trip and written per transaction.
BATCH = 1000
#: Ranges a run's values must fall in to be stored: epoch ms and spans that a
#: datetime and a JSON number hold exactly, and an attempt the column holds.
_MAX_MS = 2**53 - 1
_MAX_ATTEMPT = 2**31 - 1


class UnconvertibleEvent(ValueError):
    """A settle event whose values no database row can hold."""


@dataclass
class DrainReport:
    """What :func:`drain` did."""

    #: Stream entries read, and run rows created (fewer when some were drained before).
    read: int = 0
    created: int = 0
    #: Job rows whose runtime mirror changed.
    jobs_updated: int = 0
    #: History rows older than ``CELERY_ZSCHED_HISTORY_DAYS`` deleted.
    pruned: int = 0
    #: Stream id of the last entry drained ("0": none yet).
    cursor: str = "0"
    #: Audit trail entries copied into the change history (see :mod:`.audit`).
    changes: int = 0
    #: Entries that could not become a row: skipped, logged and counted.
    skipped: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (a Celery task's result)."""
        return asdict(self)


def drain(max_items: int = 100_000, *, batch: int = BATCH, prune: bool = True) -> DrainReport:
    """Copy up to ``max_items`` new settle events into :class:`ZSchedRun`; idempotent.

    The audit trail's new entries are copied into the change history as well.
    Then, with ``prune``, delete history older than ``CELERY_ZSCHED_HISTORY_DAYS``.
    Raises :class:`~celery_zsched.core.errors.StoreUnavailable` if Redis is down.
    """
    started = time.perf_counter()
    store = get_store()
    with redis_unavailable():
        report = _drain(store, max_items, batch)
    report.changes = drain_changes(max_items, batch=batch).created
    if prune:
        report.pruned = prune_history()
    report.seconds = time.perf_counter() - started
    return report


def _drain(store: Store, max_items: int, batch: int) -> DrainReport:
    report = DrainReport(cursor=read_cursor(store))
    # Each partition has its own stream and cursor; with several, a run's
    # stream_id is "partition/entry id", since entry ids repeat across streams.
    for part in range(store.partitions):
        cursor = read_cursor(store, part)
        label = f"{part}/" if store.partitions > 1 else ""
        while report.read < max_items:
            events = store.events(after=cursor, count=min(batch, max_items - report.read),
                                  part=part)
            if not events:
                break
            events = [(label + sid, fields) for sid, fields in events]
            with transaction.atomic():
                created, skipped = _record(events)
                report.created += created
                report.jobs_updated += _refresh_mirror(store, events)
            if skipped:
                report.skipped += skipped
                store.count("history_skipped", skipped, part)
            # The cursor moves only after the rows are committed: a crash in between
            # re-reads entries whose rows exist, which the unique stream_id absorbs.
            cursor = events[-1][0].rpartition("/")[2]
            advance_cursor(store, cursor, part)
            report.cursor = events[-1][0]
            report.read += len(events)
    return report


def read_cursor(store: Store, part: int = 0) -> str:
    """Stream id of partition ``part``'s last drained entry ("0" before the first drain)."""
    return store.drain_cursor(part)


def advance_cursor(store: Store, cursor: str, part: int = 0) -> bool:
    """Move the cursor forward to ``cursor``; never backwards (two drains may race)."""
    return store.advance_drain_cursor(cursor, part)


def prune_history(days: int | None = None) -> int:
    """Delete runs that finished more than ``days`` ago (default: the setting; 0 keeps all)."""
    days = get_django_settings().history_days if days is None else days
    if days <= 0:
        return 0
    cutoff = dj_timezone.now() - timedelta(days=days)
    # ZSchedRun has no dependants and no delete signals: one DELETE statement.
    deleted, _ = ZSchedRun.objects.filter(finished_at__lt=cutoff).delete()
    return deleted


# ---------------------------------------------------------------- internals
def run_from_event(stream_id: str, fields: Mapping[str, str]) -> ZSchedRun:
    """The :class:`ZSchedRun` of one stream entry (fields as written by ``settle.lua``).

    Raises :class:`UnconvertibleEvent` when a value is out of every range a row holds.
    """
    try:
        data: dict[str, Any] = json.loads(fields.get("data") or "{}") or {}
    except (ValueError, RecursionError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    settled = _int(fields.get("at")) or stream_ids.millis(stream_id)
    try:
        return ZSchedRun(
            job_id=fields.get("id", ""),
            occurrence=_bounded(fields.get("occ"), 0, _MAX_MS) or 0,
            attempt=_bounded(fields.get("attempt"), 1, _MAX_ATTEMPT) or 1,
            status=fields.get("status", ""),
            error=fields.get("error", ""),
            task_id=str(data.get("task_id") or "")[:64],
            due_at=_when(data.get("due_ms")),
            promoted_at=_when(data.get("promoted_ms")),
            started_at=_when(data.get("started_ms")),
            finished_at=_when(settled),
            wait_ms=_bounded(data.get("wait_ms"), -_MAX_MS, _MAX_MS),
            duration_ms=_bounded(data.get("duration_ms"), -_MAX_MS, _MAX_MS),
            lateness_ms=_bounded(data.get("lateness_ms"), -_MAX_MS, _MAX_MS),
            stream_id=stream_id,
        )
    except (OverflowError, ValueError, TypeError) as exc:
        raise UnconvertibleEvent(f"settle event {stream_id}: {exc}") from exc


def _int(value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(float(value))
    except (TypeError, ValueError, OverflowError):
        return None


def _bounded(value: Any, low: int, high: int) -> int | None:
    number = _int(value)
    if number is not None and not low <= number <= high:
        raise ValueError(f"{number!r:.30} is outside [{low}, {high}]")
    return number


def _when(value: Any) -> Any:
    return to_db_datetime(_bounded(value, 0, _MAX_MS))


def _record(events: Sequence[tuple[str, Mapping[str, str]]]) -> tuple[int, int]:
    """Insert the runs of ``events`` not recorded yet: (created, skipped as unconvertible)."""
    ids = [stream_id for stream_id, _fields in events]
    seen: set[str] = set()
    for part in batched(ids, IN_CHUNK):
        seen.update(ZSchedRun.objects.filter(stream_id__in=part)
                    .values_list("stream_id", flat=True))
    runs, skipped = [], 0
    for sid, fields in events:
        if sid in seen:
            continue
        try:
            runs.append(run_from_event(sid, fields))
        except UnconvertibleEvent as exc:
            skipped += 1
            logger.warning("zsched: run history skips %s", exc)
    # ignore_conflicts too: a concurrent drain may insert the same entries now.
    ZSchedRun.objects.bulk_create(runs, batch_size=500, ignore_conflicts=True)
    return len(runs), skipped


def _refresh_mirror(store: Store, events: Sequence[tuple[str, Mapping[str, str]]]) -> int:
    last: dict[str, Mapping[str, str]] = {}
    for _sid, fields in events:
        if fields.get("id"):
            last[fields["id"]] = fields
    ids = list(last)
    # Counters come from the state Redis keeps (one HMGET), not from summing
    # events, so the mirror is right however often an entry is drained.
    targets: dict[str, dict[str, Any]] = {}
    for job_id, state in zip(ids, store.states(ids), strict=True):
        if state is not None:
            targets[job_id] = mirror_values(state)
        else:
            # The job left Redis since (deleted): keep its counters, record
            # the last outcome from the event itself.
            fields = last[job_id]
            try:
                last_run = _when(fields.get("at"))
            except (OverflowError, ValueError):
                last_run = None  # that event was skipped, and is not the job's last run
            targets[job_id] = {
                "last_status": fields.get("status", ""), "last_error": fields.get("error", ""),
                "last_run_at": last_run}
    changed: list[ZSchedJob] = []
    for part in batched(ids, IN_CHUNK):
        rows = ZSchedJob.objects.filter(job_id__in=part).only("pk", "job_id", *MIRROR_FIELDS)
        changed += [row for row in rows if row.apply_values(targets[row.job_id])]
    ZSchedJob.objects.bulk_update(changed, MIRROR_FIELDS, batch_size=500)
    return len(changed)
