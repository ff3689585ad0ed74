"""Dead letters: jobs whose occurrence crashed ``max_deliveries`` times in a row.

The reaper records each in the ``dead`` sorted set (id -> time of death, ms)
and leaves the job's definition and state in place, with the status
``dead``. Nothing but an operator takes it out again:

* :meth:`Store.requeue_dead` makes the job due now, unpaused, with its crash,
  attempt and failure-streak counters reset;
* :meth:`Store.purge_dead` drops the dead letter and keeps the job, paused
  (delete it with ``zsched delete`` to be rid of it).

Re-imports, beat restarts (the static ``beat_schedule`` upsert) and the
Django reconcile all upsert, and ``upsert.lua`` never moves a dead job, so
none of them loses a dead letter.

This module reads them for the CLI and the admin: one pipeline per call,
over every partition.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from celery_zsched.core.results import JobInfo
from celery_zsched.core.timing import ms_to_dt
from celery_zsched.store import Store
from celery_zsched.store.errors import redis_unavailable

#: Characters of the last error shown in a table cell (the full text: ``dead show``).
SHORT_ERROR = 80


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter: the job, when it died, and its live state."""

    job_id: str
    died_ms: int
    #: The job and its state; ``None`` if the definition went meanwhile.
    info: JobInfo | None

    @property
    def target(self) -> str:
        """Name and/or URL: what an operator recognises the job by."""
        if self.info is None:
            return ""
        job = self.info.job
        return " ".join(x for x in (job.name, job.url) if x)

    @property
    def task(self) -> str:
        return self.info.job.task if self.info is not None else ""

    @property
    def deliveries(self) -> int:
        """Executions of the dead occurrence whose worker died (the crash count)."""
        return self.info.state.crashes if self.info is not None else 0

    @property
    def last_error(self) -> str:
        return (self.info.state.last_error or "") if self.info is not None else ""


def _checked(store: Store) -> None:
    if not store.layout_checked:
        store.check_layout()


def count(store: Store) -> int:
    """Dead letters in every partition (one ZCARD each, one pipeline)."""
    with redis_unavailable():
        _checked(store)
        pipe = store.client.pipeline(transaction=False)
        for keys in store.parts:
            pipe.zcard(keys.dead)
        return sum(int(n) for n in pipe.execute())


def all_ids(store: Store) -> list[str]:
    """Every dead-lettered id, newest death first (for ``--all``)."""
    return [job_id for job_id, _ in _entries(store, -1)]


def _entries(store: Store, limit: int) -> list[tuple[str, int]]:
    # Each partition's newest ``limit`` (all: -1), merged newest first.
    with redis_unavailable():
        _checked(store)
        pipe = store.client.pipeline(transaction=False)
        for keys in store.parts:
            pipe.zrevrange(keys.dead, 0, limit - 1 if limit > 0 else -1, withscores=True)
        merged = heapq.merge(*pipe.execute(), key=lambda row: row[1], reverse=True)
        rows = [(str(job_id), int(score)) for job_id, score in merged]
    return rows[:limit] if limit > 0 else rows


def latest(store: Store, limit: int) -> list[DeadLetter]:
    """The ``limit`` most recent dead letters, newest first, with their jobs."""
    return _with_infos(store, _entries(store, limit))


def died_at(store: Store, ids: Sequence[str]) -> list[int | None]:
    """Time of death of each of ``ids`` (ms), ``None`` where it is not a dead letter."""
    if not ids:
        return []
    with redis_unavailable():
        _checked(store)
        groups = store.group(ids)
        pipe = store.client.pipeline(transaction=False)
        for part, members in groups.items():
            pipe.zmscore(store.parts[part].dead, members)
        found = {job_id: score for members, scores in zip(groups.values(), pipe.execute(),
                                                          strict=True)
                 for job_id, score in zip(members, scores, strict=True)}
    return [None if found.get(i) is None else int(found[i]) for i in ids]


def lookup(store: Store, ids: Sequence[str]) -> list[DeadLetter | None]:
    """The dead letters of ``ids`` in their order, ``None`` for ids that are not one."""
    scores = died_at(store, ids)
    pairs = [(i, s) for i, s in zip(ids, scores, strict=True) if s is not None]
    letters = {d.job_id: d for d in _with_infos(store, pairs)}
    return [letters.get(i) for i in ids]


def _with_infos(store: Store, pairs: Sequence[tuple[str, int]]) -> list[DeadLetter]:
    infos = store.get_many([job_id for job_id, _ in pairs])
    return [DeadLetter(job_id, died, info)
            for (job_id, died), info in zip(pairs, infos, strict=True)]


def iso(ms: int) -> str:
    """UTC, to the second, with a Z: the same in every zone the operator sits in."""
    return ms_to_dt(ms).isoformat(timespec="seconds").replace("+00:00", "Z")


def ago(ms: int, now_ms: int) -> str:
    """How long ago, in the largest whole unit: "42s ago", "3h ago", "2d ago"."""
    seconds = max(0, (now_ms - ms) // 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def short(text: str, width: int = SHORT_ERROR) -> str:
    """One line of at most ``width`` characters (tracebacks span many)."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[:width - 1] + "…"
