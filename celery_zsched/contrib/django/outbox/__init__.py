"""The transactional outbox: a saved change of a job always reaches Redis, in order.

Every change this package makes to a :class:`ZSchedJob` row (a save or delete
through the ORM or the admin, pause and resume, ``zsched_import``, the REST API's
Django writer) records a :class:`ZSchedOutbox` entry **in the same database
transaction** (:func:`record`). The entry's id is the change's *version*: ids
only grow, and the row's ``version`` column is the id of its newest entry.

* **Fast path.** After the commit the change is pushed to Redis
  (:func:`push_after_commit`), with its version; a push that Redis confirms
  deletes the job's entries up to that version (:func:`confirm`).
* **Retries.** A push that could not reach Redis leaves its entries, and so
  does a process that died between the commit and the push. The sweeper
  (:class:`Sweeper`), a thread the app starts in every beat process
  (``beat_init``), reads the entries that are due (an index on the pending
  ones: the cost is O(pending), never O(jobs)), pushes each job's *current*
  row at its version (or its delete), and deletes what Redis confirmed. While
  Redis is unreachable it tries again after ``zsched_outbox_interval_s``,
  doubling up to ``zsched_outbox_backoff_max_s``; an outage never counts
  against a change. A change Redis refuses, or whose row is invalid, is tried
  again after 1 s, 2 s, 4 s ... (at most :data:`RETRY_MAX_S`), and after
  ``zsched_outbox_max_attempts`` failures it is dead-lettered: kept, shown in
  the admin, retried when an operator asks or when a newer change of the job
  is pushed.
* **Order.** Redis applies a versioned write only if it holds no newer version
  of the job, and a delete leaves a tombstone of its version (``upsert.lua``,
  ``control.lua``), so pushes that arrive out of order, retries and late
  pushes never move a job back nor bring a deleted one back.

Why an outbox table rather than a ``synced_version`` column on the job rows:
a delete must outlive its row, a rename is a delete of one id and a save of
another, each change carries its actor and note for the audit trail, and the
pending set stays a small table of its own (an index over a few rows), so
confirming a push never rewrites a row of a table of millions.

Recording is in :mod:`.recording`, pushing and confirming in :mod:`.pushing`,
the sweeper in :mod:`.sweeper`, the counts in :mod:`.state`; every name is
importable from here.
"""

from __future__ import annotations

from celery_zsched.contrib.django.outbox.pushing import (
    CONFIRM_PARAMS,
    Change,
    Sent,
    confirm,
    push,
    push_after_commit,
    send,
)
from celery_zsched.contrib.django.outbox.recording import (
    DELETE,
    PAUSE,
    RESUME,
    SAVE,
    record,
    write_rows,
)
from celery_zsched.contrib.django.outbox.state import OutboxStatus, status
from celery_zsched.contrib.django.outbox.sweeper import (
    REPORT_EVERY_S,
    RETRY_MAX_S,
    SWEEP_BATCH,
    WARN_EVERY_S,
    Sweeper,
    SweepReport,
    retry_dead,
    retry_delay_s,
    start_sweeper,
    stop_sweeper,
    sweep,
)

__all__ = [
    "CONFIRM_PARAMS",
    "DELETE",
    "PAUSE",
    "REPORT_EVERY_S",
    "RESUME",
    "RETRY_MAX_S",
    "SAVE",
    "SWEEP_BATCH",
    "WARN_EVERY_S",
    "Change",
    "OutboxStatus",
    "Sent",
    "SweepReport",
    "Sweeper",
    "confirm",
    "push",
    "push_after_commit",
    "record",
    "retry_dead",
    "retry_delay_s",
    "send",
    "start_sweeper",
    "status",
    "stop_sweeper",
    "sweep",
    "write_rows",
]
