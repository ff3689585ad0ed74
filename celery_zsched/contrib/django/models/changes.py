"""The audit trail: :class:`ZSchedJobChange`, one recorded change of one job."""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from celery_zsched.contrib.django.models.choices import ActorKind, ChangeAction
from celery_zsched.contrib.django.models.job import ZSchedJob


class ZSchedJobChange(models.Model):
    """One recorded change of one job: the audit trail, copied from Redis in bulk.

    Every change (from the admin, the CLI, an import, reconcile or the API) is
    recorded in Redis by the script that makes it;
    :func:`~celery_zsched.contrib.django.audit.drain_changes` copies the entries
    here. ``job`` is a foreign key on the job id without a database constraint,
    and deleting a job leaves its changes in place: the trail of a deleted job
    (its delete included) is still there to read.
    """

    job = models.ForeignKey(
        ZSchedJob, to_field="job_id", db_column="job_id", db_constraint=False,
        on_delete=models.DO_NOTHING, related_name="changes", null=True, blank=True,
        # The (job, -at) index below serves lookups by job too.
        db_index=False)
    at = models.DateTimeField(help_text="When the change was made, on the Redis clock.")
    actor_kind = models.CharField("by (kind)", max_length=20, choices=ActorKind.choices)
    actor_name = models.CharField("by", max_length=150, blank=True)
    action = models.CharField(max_length=20, choices=ChangeAction.choices)
    diff = models.JSONField(default=dict, blank=True,
                            help_text='Changed fields: {"field": [old, new]}.')
    note = models.TextField(blank=True)
    stream_id = models.CharField(max_length=40, unique=True,
                                 help_text="Redis stream entry id: makes the drain idempotent.")

    objects: ClassVar[models.Manager[ZSchedJobChange]] = models.Manager()

    class Meta:
        db_table = "zsched_job_change"
        verbose_name = "job change"
        verbose_name_plural = "job changes"
        indexes = (
            models.Index(fields=["job", "-at"], name="zsched_change_job_at"),
            models.Index(fields=["at"], name="zsched_change_at"),
        )

    def __str__(self) -> str:
        return f"{self.job_id} {self.action} by {self.actor_kind}:{self.actor_name}"
