"""Periodic maintenance tasks; schedule them in ``CELERY_BEAT_SCHEDULE``::

    CELERY_BEAT_SCHEDULE = {
        "zsched-drain-history": {
            "task": "celery_zsched.contrib.django.tasks.drain_history",
            "schedule": 60.0,
        },
        "zsched-reconcile": {
            "task": "celery_zsched.contrib.django.tasks.reconcile",
            "schedule": 86400.0,
        },
    }

Both are idempotent, and the scheduler never runs two of the same job at once.
Reconcile is the safety net for a Redis that lost its data, not how edits reach
Redis (the outbox does that, see :mod:`.outbox`): once a day is plenty.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task


@shared_task(name="celery_zsched.contrib.django.tasks.reconcile", ignore_result=True)
def reconcile(dry_run: bool = False, prune: bool = True) -> dict[str, Any]:
    """Bring Redis in line with the database (see :func:`..sync.reconcile`)."""
    from celery_zsched.contrib.django.sync import reconcile as run

    return run(dry_run=dry_run, prune=prune).as_dict()


@shared_task(name="celery_zsched.contrib.django.tasks.drain_history", ignore_result=True)
def drain_history(max_items: int = 100_000) -> dict[str, Any]:
    """Copy settle events into run history and prune it (see :func:`..history.drain`)."""
    from celery_zsched.contrib.django.history import drain

    return drain(max_items).as_dict()
