"""Save and delete of a :class:`ZSchedJob` reach Redis: recorded with the row, pushed on commit.

Each save or delete records an outbox entry in the row's own transaction
(:mod:`.outbox`); after the commit the change is pushed to Redis with its
version, and the entry goes. If Redis is unreachable then (or the process dies
first), the entry stays and the sweeper in beat pushes the change within
seconds of Redis being back; the save itself never fails because of Redis.
Queryset ``delete()`` sends ``post_delete`` for every row, so each deleted row
is recorded and pushed too. Queryset ``update()``, ``bulk_create()`` and raw SQL
of your own send no signals and record nothing: run
:func:`celery_zsched.contrib.django.sync.reconcile` after those (``manage.py
zsched_sync``). The package's own bulk writes (import, pause and resume, the REST
API) record their changes themselves.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from celery_zsched.contrib.django import audit, outbox
from celery_zsched.contrib.django.models import DEFINITION_FIELDS, ZSchedJob
from celery_zsched.core.errors import ValidationError

logger = logging.getLogger("celery_zsched.django")


@receiver(post_save, sender=ZSchedJob, dispatch_uid="zsched_job_saved")
def job_saved(sender: type[ZSchedJob], instance: ZSchedJob, using: str,
              update_fields: Any = None, **kwargs: Any) -> None:
    """Record the saved definition (and the removal of a renamed id); push them on commit."""
    if update_fields is not None and set(DEFINITION_FIELDS).isdisjoint(update_fields):
        return  # the runtime mirror alone: nothing Redis keeps changed
    renamed = instance._zsched_loaded_id
    old_id = renamed if renamed and renamed != instance.job_id else None
    instance._zsched_loaded_id = instance.job_id
    # The actor is bound now: the push may run after the request has gone.
    by, note = audit.current()
    changes = []
    if old_id is not None:
        removed = outbox.record([old_id], outbox.DELETE, using=using, by=by, note=note)
        changes.append(outbox.Change(old_id, removed, outbox.DELETE, by=by, note=note))
    instance.version = outbox.record([instance.job_id], outbox.SAVE, using=using, by=by,
                                     note=note)
    try:
        # Built now, not in the callback: the callback must not read the database,
        # and a later save in the same transaction records its own, later version.
        job, error = instance.to_job(), ""
    except ValidationError as exc:
        # Saved without full_clean() (shell, fixtures): the row stays and Redis keeps
        # the previous definition; the change waits in the outbox, counting failed
        # attempts, until the row is fixed or it is dead-lettered (shown in the admin).
        logger.error("zsched: job %s is invalid and was not sent to Redis: %s",
                     instance.job_id, exc)
        job, error = None, f"invalid row: {exc}"
    changes.append(outbox.Change(instance.job_id, instance.version, outbox.SAVE, job, by, note,
                                 error=error))
    outbox.push_after_commit(changes, using=using)


@receiver(post_delete, sender=ZSchedJob, dispatch_uid="zsched_job_deleted")
def job_deleted(sender: type[ZSchedJob], instance: ZSchedJob, using: str,
                **kwargs: Any) -> None:
    """Record the delete (inside the delete's transaction); push it on commit."""
    job_id = instance._zsched_loaded_id or instance.job_id
    if job_id:
        by, note = audit.current()
        version = outbox.record([job_id], outbox.DELETE, using=using, by=by, note=note)
        outbox.push_after_commit([outbox.Change(job_id, version, outbox.DELETE, by=by,
                                                note=note)], using=using)
