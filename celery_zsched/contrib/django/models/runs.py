"""Run history: :class:`ZSchedRun`, one settle of one job, copied from Redis in bulk."""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from celery_zsched.contrib.django.models.choices import RunStatus
from celery_zsched.contrib.django.models.job import ZSchedJob


class ZSchedRun(models.Model):
    """One settle of one job: run history, copied from the Redis event stream in bulk.

    ``job_id`` always holds the job's id string. ``job`` is a foreign key on
    that id *without* a database constraint, because settles also come from
    jobs that have no row: static ``beat_schedule`` entries, jobs added with
    the CLI, and jobs deleted after their run. The drain can then insert rows
    without looking up primary keys, and deleting a job (through the ORM)
    still cascades to its history. ``null=True`` makes ``select_related``
    use an outer join, so rows of jobs without a row are kept (``run.job``
    is then ``None``); the column itself is never null.
    """

    job = models.ForeignKey(
        ZSchedJob, to_field="job_id", db_column="job_id", db_constraint=False,
        on_delete=models.CASCADE, related_name="runs", null=True, blank=True,
        # The (job, -finished_at) index below serves lookups by job too.
        db_index=False)
    occurrence = models.BigIntegerField(help_text="Due time (epoch ms) naming the occurrence.")
    attempt = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=20, choices=RunStatus.choices)
    error = models.TextField(blank=True)
    task_id = models.CharField(max_length=64, blank=True)
    due_at = models.DateTimeField(null=True, blank=True)
    promoted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(
        help_text="When the outcome was settled, on the Redis clock.")
    wait_ms = models.BigIntegerField(null=True, blank=True,
                                     help_text="Promote to task start.")
    duration_ms = models.BigIntegerField(null=True, blank=True)
    lateness_ms = models.BigIntegerField(null=True, blank=True,
                                         help_text="Due to promote (beat's lateness).")
    stream_id = models.CharField(max_length=40, unique=True,
                                 help_text="Redis stream entry id: makes the drain idempotent.")

    objects: ClassVar[models.Manager[ZSchedRun]] = models.Manager()

    class Meta:
        db_table = "zsched_run"
        verbose_name = "job run"
        verbose_name_plural = "job runs"
        indexes = (
            models.Index(fields=["job", "-finished_at"], name="zsched_run_job_finished"),
            # Pruning and "recent runs" statistics filter on the time alone.
            models.Index(fields=["finished_at"], name="zsched_run_finished"),
            # Covers the dashboard's per-hour outcome counts and lateness
            # percentiles: they read this index only, never the table rows.
            models.Index(fields=["finished_at", "status", "lateness_ms"],
                         name="zsched_run_window"),
        )

    def __str__(self) -> str:
        return f"{self.job_id} #{self.occurrence}.{self.attempt} {self.status}"
