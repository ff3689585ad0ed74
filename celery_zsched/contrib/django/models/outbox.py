"""The transactional outbox's table: :class:`ZSchedOutbox`.

Its logic (recording, pushing, the sweeper) is :mod:`celery_zsched.contrib.django.outbox`.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.utils import timezone as dj_timezone

from celery_zsched.contrib.django.models.choices import ActorKind, SyncAction


class ZSchedOutbox(models.Model):
    """One change of a job row not yet confirmed in Redis: the transactional outbox.

    Written in the transaction of the change itself
    (:mod:`celery_zsched.contrib.django.outbox`), so a change is never saved
    without it. The push after the commit deletes it; one that could not reach
    Redis stays, and the sweeper in beat retries it. Its ``id`` is the change's
    version: a row's ``version`` is the id of its newest entry, and Redis
    refuses an older one. Only pending and dead-lettered changes are here, so
    the table stays small whatever the number of jobs.
    """

    job_id = models.CharField("job id", max_length=200)
    action = models.CharField(max_length=10, choices=SyncAction.choices)
    actor_kind = models.CharField("by (kind)", max_length=20, choices=ActorKind.choices)
    actor_name = models.CharField("by", max_length=150, blank=True)
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(default=dj_timezone.now)
    #: Failed pushes that were this change's own fault (Redis being down never counts).
    attempts = models.PositiveIntegerField(default=0)
    next_try_at = models.DateTimeField(default=dj_timezone.now)
    last_error = models.TextField(blank=True)
    #: Set after ``zsched_outbox_max_attempts`` failed attempts: kept, shown in the
    #: admin, retried only when an operator asks (or a newer change supersedes it).
    dead_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[models.Manager[ZSchedOutbox]] = models.Manager()

    class Meta:
        db_table = "zsched_outbox"
        verbose_name = "change not yet in Redis"
        verbose_name_plural = "changes not yet in Redis"
        indexes = (
            # The sweeper's query: pending changes due for a try, oldest first.
            models.Index(fields=["next_try_at", "id"], name="zsched_outbox_due",
                         condition=models.Q(dead_at__isnull=True)),
            # A push confirmed: its job's entries up to its version go.
            models.Index(fields=["job_id", "id"], name="zsched_outbox_job"),
        )

    def __str__(self) -> str:
        return f"{self.action} {self.job_id} (version {self.pk})"
