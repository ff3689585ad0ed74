"""Save and delete of a :class:`ZSchedJob` reach Redis after the transaction commits.

Queryset ``update()``, ``bulk_create()``, ``bulk_update()`` and raw SQL send no
signals, so Redis does not follow them: run
:func:`celery_zsched.contrib.django.sync.reconcile` after those
(``manage.py zsched_sync`` or the periodic task). Queryset ``delete()`` does
send ``post_delete`` for every row, so each deleted row costs one Redis call
after commit. If Redis is unreachable at commit, the change is logged and left
to reconcile; the save itself never fails because of Redis.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from celery_zsched.errors import ValidationError

from . import audit, sync
from .models import ZSchedJob

logger = logging.getLogger("celery_zsched.django")


@receiver(post_save, sender=ZSchedJob, dispatch_uid="zsched_job_saved")
def job_saved(sender: type[ZSchedJob], instance: ZSchedJob, using: str,
              **kwargs: Any) -> None:
    """Queue an upsert of the saved definition (and the removal of a renamed id)."""
    renamed = instance._zsched_loaded_id
    old_id = renamed if renamed and renamed != instance.job_id else None
    instance._zsched_loaded_id = instance.job_id
    try:
        # Built now, not in the callback: the callback must not read the database,
        # and a later save in the same transaction queues its own, later upsert.
        job = instance.to_job()
    except ValidationError as exc:
        # Saved without full_clean() (shell, fixtures): the row stays, Redis keeps
        # the previous definition, and reconcile reports the row as invalid.
        logger.error("zsched: job %s is invalid and was not sent to Redis: %s",
                     instance.job_id, exc)
        job = None
    if job is None and old_id is None:
        return
    # The actor is bound now: the callback may run after the request has gone.
    by, note = audit.current()
    transaction.on_commit(functools.partial(sync.push, job, replaces=old_id, by=by, note=note),
                          using=using)


@receiver(post_delete, sender=ZSchedJob, dispatch_uid="zsched_job_deleted")
def job_deleted(sender: type[ZSchedJob], instance: ZSchedJob, using: str,
                **kwargs: Any) -> None:
    """Queue the removal of the deleted job from Redis."""
    job_id = instance._zsched_loaded_id or instance.job_id
    if job_id:
        by, note = audit.current()
        transaction.on_commit(functools.partial(sync.remove, [job_id], by=by, note=note),
                              using=using)
