"""The Celery app of the example project.

Run it as ``celery -A proj worker`` and ``celery -A proj beat -S celery_zsched``
from the ``example_project`` directory.
"""

from __future__ import annotations

import os

from celery import Celery

# The one line that installs the worker-side settle hooks: every task beat
# publishes reports its outcome back to the schedule.
import celery_zsched.worker  # noqa: F401

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
# CELERY_* Django settings become Celery settings: CELERY_BROKER_URL is
# broker_url, CELERY_ZSCHED_REDIS_URL is zsched_redis_url, and so on.
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
