"""celery-zsched: a Celery beat scheduler for very large fleets of recurring jobs.

Run it with ``celery -A proj beat -S celery_zsched`` and install the worker-side
settle hooks with ``import celery_zsched.worker`` in your Celery app module.
"""

from __future__ import annotations

from celery_zsched.config import Settings
from celery_zsched.core.errors import (
    BrokerUnavailable,
    ConfigurationError,
    ImportValidationError,
    JobFailed,
    JobNotFound,
    StoreUnavailable,
    ValidationError,
    ZSchedError,
)
from celery_zsched.core.job import Job, job_id_for_url
from celery_zsched.store import Store, task_id_for

__all__ = [
    "BrokerUnavailable", "ConfigurationError", "ImportValidationError", "Job", "JobFailed",
    "JobNotFound", "Settings", "Store", "StoreUnavailable", "ValidationError", "ZSchedError",
    "job_id_for_url", "task_id_for",
]
__version__ = "0.1.0"
