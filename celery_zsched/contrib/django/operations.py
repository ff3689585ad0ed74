"""The admin's job actions (pause, resume, run now, reset failures) over a queryset.

Shared by the admin and the REST API's :class:`.api_writer.ModelWriter`, so a
pause through either is the same Redis state change and the same column update.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet

from celery_zsched.audit import Actor

from .conf import get_store
from .models import ZSchedJob

#: action name -> (Store method, past tense for the message, DB columns to set).
OPERATIONS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "pause": ("pause", "Paused", {"enabled": False}),
    "resume": ("resume", "Resumed", {"enabled": True}),
    "run_now": ("run_now", "Queued to run now", {}),
    # The mirror follows Redis at once, so the list stops showing the job as failing.
    "reset_failures": ("reset_failures", "Reset the failures of",
                       {"consecutive_failures": 0, "failure_count": 0, "last_error": ""}),
}


def apply_operation(operation: str, queryset: QuerySet[ZSchedJob], *, by: Actor | None = None,
                    note: str = "") -> tuple[int, int, float]:
    """Run ``operation`` on every job of ``queryset``: (rows, changed in Redis, seconds).

    One Store pipeline (the Store chunks the ids inside it) and at most one SQL
    UPDATE, whatever the number of rows. Redis goes first: if it is down the
    operation fails as a whole and the database is left as it was.
    """
    started = time.perf_counter()
    method, _, columns = OPERATIONS[operation]
    ids = list(queryset.values_list("job_id", flat=True))
    if not ids:
        return 0, 0, 0.0
    store_call: Callable[..., int] = getattr(get_store(), method)
    changed = store_call(*ids, by=by, note=note)
    if columns:
        # update() sends no save signals: Redis already has the change, and a
        # per-row on_commit upsert of 10,000 rows is what this avoids.
        # The queryset itself, not job_id__in=ids: one statement whatever the
        # count, and no bound-parameter limit (SQLite's is 999 on old builds).
        queryset.update(**columns)
    return len(ids), changed, time.perf_counter() - started
