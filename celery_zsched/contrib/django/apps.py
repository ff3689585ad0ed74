"""App configuration: label ``zsched``; signals are connected in :meth:`ready`.

Including the outbox's sweeper: every beat process of the project (``celery beat``,
or a worker's embedded ``-B`` beat) starts it on Celery's ``beat_init``, once
Django is set up (Celery's Django fix-up runs ``django.setup()`` first).
"""

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
        from celery.signals import beat_embedded_init, beat_init

        from celery_zsched.contrib.django import checks, signals  # noqa: F401
        from celery_zsched.contrib.django.outbox import start_sweeper

        beat_init.connect(start_sweeper, dispatch_uid="zsched_outbox_sweeper")
        beat_embedded_init.connect(start_sweeper, dispatch_uid="zsched_outbox_sweeper_embedded")
