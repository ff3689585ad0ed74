"""Signals about failing jobs, for projects to connect to: the public path of
:mod:`celery_zsched.services.signals`, where they are defined."""

from celery_zsched.services.signals import (
    SIGNALS,
    BreakerEvent,
    Event,
    JobEvent,
    domain_breaker_opened,
    job_dead_lettered,
    job_failed,
    job_failing_streak,
    job_retries_exhausted,
)

__all__ = ["SIGNALS", "BreakerEvent", "Event", "JobEvent", "domain_breaker_opened",
           "job_dead_lettered", "job_failed", "job_failing_streak", "job_retries_exhausted"]
