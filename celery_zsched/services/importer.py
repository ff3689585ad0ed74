"""Importing a file of jobs into the store: the CLI's and the tests' way in."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from celery_zsched.core.audit import Actor
from celery_zsched.core.errors import ValidationError
from celery_zsched.core.formats import iter_rows
from celery_zsched.core.results import ImportReport
from celery_zsched.core.rows import import_actor, parse_rows
from celery_zsched.store import Store


def import_file(store: Store, path: str | Path, fmt: str | None = None, *,
                skip_invalid: bool = False,
                progress: Callable[[int], None] | None = None,
                by: Actor | None = None) -> tuple[ImportReport, list[ValidationError]]:
    """Read, validate and store a file of jobs, first runs staggered over their intervals.

    Nothing is written unless every row is valid (else
    :class:`ImportValidationError`); with ``skip_invalid`` the valid rows are
    stored and the errors of the others returned. Jobs get ``store.defaults``.
    Re-importing a file updates definitions but does not move schedules.
    ``progress`` is called with the number of jobs stored so far. Changes are
    recorded as made ``by`` (default: an ``import`` by this user, of this file).
    """
    # Rows are consumed as they are parsed, so they are never all in memory
    # next to the jobs built from them.
    result = parse_rows(iter_rows(path, fmt), store.defaults,
                        skip_invalid=skip_invalid)
    report = store.upsert_many(result.jobs, stagger=True, total=len(result.jobs),
                               progress=progress, by=by or import_actor(path))
    return report, result.errors


