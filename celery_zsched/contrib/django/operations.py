"""The admin's job actions (pause, resume, run now, reset failures) over a queryset.

Shared by the admin and the REST API's :class:`.api_writer.ModelWriter`, so a
pause through either is the same Redis state change and the same column update.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models import QuerySet

from celery_zsched.contrib.django import audit, outbox
from celery_zsched.contrib.django.conf import get_store
from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.core.audit import Actor
from celery_zsched.core.errors import StoreUnavailable

#: action name -> (Store method, past tense for the message, DB columns to set).
OPERATIONS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "pause": ("pause", "Paused", {"enabled": False}),
    "resume": ("resume", "Resumed", {"enabled": True}),
    "run_now": ("run_now", "Queued to run now", {}),
    # The mirror follows Redis at once, so the list stops showing the job as failing.
    "reset_failures": ("reset_failures", "Reset the failures of",
                       {"consecutive_failures": 0, "failure_count": 0, "last_error": ""}),
}


class OperationResult(NamedTuple):
    """What :func:`apply_operation` did."""

    #: Rows the operation covered, and jobs it changed in Redis.
    rows: int
    changed: int
    seconds: float
    #: Pause or resume: rows saved while Redis was unreachable; their change
    #: waits in the outbox and reaches Redis when it is back.
    pending: int = 0


def apply_operation(operation: str, queryset: QuerySet[ZSchedJob], *, by: Actor | None = None,
                    note: str = "") -> OperationResult:
    """Run ``operation`` on every job of ``queryset``, as made ``by`` (default: the
    actor of the innermost :func:`.audit.acting` block, as for a save).

    Pause and resume change a definition (the ``enabled`` column): the rows
    that differ are updated and recorded in the outbox in one transaction,
    then one versioned Store call sets every selected job in Redis. If Redis is
    down, the rows stay changed and the outbox delivers the change when it is
    back (``pending`` counts them). Run now and reset failures change only
    Redis state (and the runtime mirror): Redis goes first, one Store pipeline,
    and if it is down the operation fails as a whole
    (:class:`~celery_zsched.core.errors.StoreUnavailable`), the database untouched.
    """
    started = time.perf_counter()
    method, _, columns = OPERATIONS[operation]
    if by is None:  # as a save does: the innermost audit.acting() block's actor
        by, note = audit.current()[0], note or audit.current()[1]
    if operation in ("pause", "resume"):
        return _set_enabled(operation, queryset, by, note, started)
    ids = list(queryset.values_list("job_id", flat=True))
    if not ids:
        return OperationResult(0, 0, 0.0)
    store_call: Callable[..., int] = getattr(get_store(), method)
    changed = store_call(*ids, by=by, note=note)
    if columns:
        # The runtime mirror only (no definition field): nothing for the outbox.
        # The queryset itself, not job_id__in=ids: one statement whatever the
        # count, and no bound-parameter limit (SQLite's is 999 on old builds).
        queryset.update(**columns)
    return OperationResult(len(ids), changed, time.perf_counter() - started)


def _set_enabled(operation: str, queryset: QuerySet[ZSchedJob], by: Actor, note: str,
                 started: float) -> OperationResult:
    using = queryset.db
    with transaction.atomic(using=using):
        ids = list(queryset.values_list("job_id", flat=True))
        changed, version = outbox.write_rows(ids, OPERATIONS[operation][2], operation,
                                             using=using, by=by, note=note)
    if not ids:
        return OperationResult(0, 0, 0.0)
    # Every selected job, not only the rows that changed: a resume also brings
    # back a dead-lettered job whose row was enabled all along (unversioned).
    versions = dict.fromkeys(changed, version)
    try:
        reply = get_store().control(operation, ids, versions=versions, by=by, note=note)
    except StoreUnavailable:
        if not changed:
            raise  # nothing was saved: the operation failed as a whole
        return OperationResult(len(ids), 0, time.perf_counter() - started, len(changed))
    missing = set(reply.missing)
    outbox.confirm(outbox.Change(job_id, version, operation) for job_id in changed
                   if job_id not in missing)
    # A job Redis does not have yet stays in the outbox: the sweeper creates it.
    return OperationResult(len(ids), reply.changed, time.perf_counter() - started,
                           len(missing & set(changed)))
