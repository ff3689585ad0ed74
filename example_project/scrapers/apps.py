"""App configuration of the example scrapers."""

from __future__ import annotations

from django.apps import AppConfig


class ScrapersConfig(AppConfig):
    """The ``scrapers`` app: ``tasks.scrape`` and the ``/targets/`` views."""

    name = "scrapers"
    default_auto_field = "django.db.models.BigAutoField"
