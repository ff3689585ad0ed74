"""The names of the signals about failing jobs (:mod:`celery_zsched.signals` defines
them; the notify settings name which the notifiers report)."""

from __future__ import annotations

SIGNAL_NAMES = ("job_failed", "job_retries_exhausted", "job_dead_lettered",
                "job_failing_streak", "domain_breaker_opened")
