"""Models: the durable job definition (:class:`ZSchedJob`), its run history
(:class:`ZSchedRun`), its audit trail (:class:`ZSchedJobChange`) and the outbox
of changes not yet in Redis (:class:`ZSchedOutbox`).

Each lives in a module of its own; every name stays importable from here,
where Django and the rest of the app look for them.
"""

from __future__ import annotations

from celery_zsched.contrib.django.models.changes import ZSchedJobChange
from celery_zsched.contrib.django.models.choices import (
    ActorKind,
    ChangeAction,
    DayRule,
    JobKind,
    Recrawl,
    RunStatus,
    SyncAction,
    Transport,
)
from celery_zsched.contrib.django.models.job import (
    CORE_TO_MODEL,
    DEFINITION_FIELDS,
    MIRROR_FIELDS,
    MODEL_TO_CORE,
    ZSchedJob,
    mirror_values,
    model_field_for,
)
from celery_zsched.contrib.django.models.outbox import ZSchedOutbox
from celery_zsched.contrib.django.models.runs import ZSchedRun
from celery_zsched.contrib.django.models.values import (
    JobValidationError,
    from_db_datetime,
    raw_value_problem,
    to_db_datetime,
)

__all__ = [
    "CORE_TO_MODEL",
    "DEFINITION_FIELDS",
    "MIRROR_FIELDS",
    "MODEL_TO_CORE",
    "ActorKind",
    "ChangeAction",
    "DayRule",
    "JobKind",
    "JobValidationError",
    "Recrawl",
    "RunStatus",
    "SyncAction",
    "Transport",
    "ZSchedJob",
    "ZSchedJobChange",
    "ZSchedOutbox",
    "ZSchedRun",
    "from_db_datetime",
    "mirror_values",
    "model_field_for",
    "raw_value_problem",
    "to_db_datetime",
]
