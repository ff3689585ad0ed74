"""The beat scheduler's former path (``beat_scheduler = "celery_zsched.scheduler:..."``):
:mod:`celery_zsched.beat.scheduler` holds it; ``-S celery_zsched`` finds it by its entry point."""

from celery_zsched.beat.scheduler import ZSchedScheduler

__all__ = ["ZSchedScheduler"]
