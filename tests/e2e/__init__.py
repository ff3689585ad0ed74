"""End-to-end tests: real ``celery beat -S celery_zsched`` and ``celery worker`` processes."""
