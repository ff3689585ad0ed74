"""The choices of the model fields.

Where the core keeps the list (transports, day rules, audit actions and kinds
of actor), the choices are built from it, in its order: only the labels are
written here. A core value without a label, or a label of no core value, stops
the app from loading; a new value then changes the choices, and
``makemigrations --check`` asks for the migration that records it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import models

from celery_zsched.core.audit import ACTIONS, ACTOR_KINDS
from celery_zsched.core.fields import RECRAWL_MODES
from celery_zsched.core.job import TRANSPORTS
from celery_zsched.core.timing import DAY_RULES


def core_choices(name: str, values: Sequence[str], labels: Mapping[str, str], doc: str) -> Any:
    """A ``TextChoices`` class of the core's ``values``, in their order, with ``labels``.

    Each member is named after its value in capitals (``run_now``: ``RUN_NOW``).
    """
    if set(values) != set(labels) or len(values) != len(set(values)):
        raise ImproperlyConfigured(
            f"{name}: the labels name {sorted(labels)}, the core lists {list(values)}")
    choices = models.TextChoices(name, [(value.upper(), (value, labels[value]))
                                        for value in values],
                                 module=__name__, qualname=name)
    choices.__doc__ = doc
    return choices


class JobKind(models.TextChoices):
    """How a job is timed; derived from the definition on save (:attr:`Job.kind`)."""

    INTERVAL = "interval", "Interval"
    CRON = "cron", "Cron"
    ONCE = "once", "Once"


DayRule = core_choices("DayRule", DAY_RULES, {
    "or": "Either day field matches (crontab(5))",
    "and": "Both day fields match (Celery crontab)",
}, "How a cron's day-of-month and day-of-week fields combine "
   "(:data:`celery_zsched.core.timing.DAY_RULES`).")

Transport = core_choices("Transport", TRANSPORTS, {
    "celery": "Celery (beat publishes it)",
    "http": "HTTP (workers in any language, through the job gateway)",
}, "Who runs a job (:data:`celery_zsched.core.job.TRANSPORTS`).")

Recrawl = core_choices("Recrawl", RECRAWL_MODES, {
    "fixed": "Fixed (every interval)",
    "adaptive": "Adaptive (follows the page's change rate)",
}, "How an interval job's interval is chosen (:data:`celery_zsched.core.fields.RECRAWL_MODES`).")


class RunStatus(models.TextChoices):
    """The settle labels of :mod:`celery_zsched.store`."""

    COMPLETE = "complete", "Complete"
    RETRYING = "retrying", "Error, retrying"
    ERROR = "error", "Error"
    SKIPPED = "skipped", "Skipped (misfire)"
    BLOCKED_BY_ROBOTS = "blocked_by_robots", "Blocked by robots.txt"


ChangeAction = core_choices("ChangeAction", ACTIONS, {
    "create": "Created",
    "edit": "Edited",
    "pause": "Paused",
    "resume": "Resumed",
    "run_now": "Run now",
    "delete": "Deleted",
    "requeue": "Requeued (dead letter)",
    "purge": "Purged (dead letter)",
    "reset": "Failures reset",
}, "What a recorded change did (:data:`celery_zsched.core.audit.ACTIONS`).")

ActorKind = core_choices("ActorKind", ACTOR_KINDS, {
    "admin": "Admin user",
    "cli": "Command line",
    "import": "Import",
    "reconcile": "Reconcile",
    "api": "API",
}, "Who made a change (:data:`celery_zsched.core.audit.ACTOR_KINDS`).")


class SyncAction(models.TextChoices):
    """What an outbox entry sends to Redis."""

    SAVE = "save", "Save"
    DELETE = "delete", "Delete"
    PAUSE = "pause", "Pause"
    RESUME = "resume", "Resume"
