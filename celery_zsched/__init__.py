"""celery-zsched: a Celery beat scheduler for very large fleets of recurring jobs.

Run it with ``celery -A proj beat -S celery_zsched`` and install the worker-side
settle hooks with ``import celery_zsched.worker`` in your Celery app module.
"""

from __future__ import annotations

from .config import Settings
from .errors import (
    BrokerUnavailable,
    ConfigurationError,
    ImportValidationError,
    JobFailed,
    JobNotFound,
    StoreUnavailable,
    ValidationError,
    ZSchedError,
)
from .job import Job, job_id_for_url
from .store import Store, task_id_for

__all__ = [
    "BrokerUnavailable", "ConfigurationError", "ImportValidationError", "Job", "JobFailed",
    "JobNotFound", "Settings", "Store", "StoreUnavailable", "ValidationError", "ZSchedError",
    "job_id_for_url", "task_id_for",
]
__version__ = "0.1.0"
