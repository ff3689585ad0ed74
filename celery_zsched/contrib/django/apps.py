"""App configuration: label ``zsched``; signals are connected in :meth:`ready`."""

from __future__ import annotations

from django.apps import AppConfig


class ZSchedConfig(AppConfig):
    """The ``celery_zsched.contrib.django`` app.

    Nothing here reads settings or connects to Redis: both happen lazily, on
    first use (see :mod:`celery_zsched.contrib.django.conf`).
    """

    name = "celery_zsched.contrib.django"
    label = "zsched"
    verbose_name = "Celery zsched"
    # Pinned, so a project's DEFAULT_AUTO_FIELD never produces a migration here.
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported for their side effects: receivers and system checks register
        # themselves, and only now, when the app registry is complete.
        from . import checks, signals  # noqa: F401
