"""System checks (``manage.py check``): settings problems found before anything runs.

They read settings only when the checks run, and never connect to Redis.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Warning, register

from celery_zsched.config import Settings
from celery_zsched.contrib.django.conf import (
    ALIAS_SETTING,
    DjangoSettings,
    redis_alias,
    zsched_mapping,
)
from celery_zsched.core.errors import ConfigurationError


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``zsched.E001``: bad ``CELERY_ZSCHED_*`` values; ``E002``/``W001``: the Redis alias."""
    messages: list[CheckMessage] = []
    for read in (lambda: Settings.from_mapping(zsched_mapping()), DjangoSettings.from_django):
        try:
            read()
        except ConfigurationError as exc:
            messages.append(Error(str(exc), id="zsched.E001"))
    alias = redis_alias()
    if alias is None:
        return messages
    caches = getattr(django_settings, "CACHES", {})
    backend = str(caches.get(alias, {}).get("BACKEND", ""))
    if not backend.startswith("django_redis."):
        messages.append(Error(
            f"{ALIAS_SETTING} = {alias!r} must name a django-redis cache in CACHES "
            f"(found {backend or 'no such cache'})", id="zsched.E002"))
    elif not getattr(django_settings, "CELERY_ZSCHED_REDIS_URL", None):
        messages.append(Warning(
            f"{ALIAS_SETTING} is set but CELERY_ZSCHED_REDIS_URL is not: beat and workers "
            "do not read Django caches and will use CELERY_BROKER_URL",
            hint=f"Set CELERY_ZSCHED_REDIS_URL to the LOCATION of cache {alias!r}.",
            id="zsched.W001"))
    return messages


@register()
def check_notify_mail(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``zsched.W002``: ``CELERY_ZSCHED_NOTIFY_MAIL`` is on but ``ADMINS`` is empty."""
    try:
        settings = Settings.from_mapping(zsched_mapping())
    except ConfigurationError:
        return []  # zsched.E001 reports it
    if settings.notify_mail and not getattr(django_settings, "ADMINS", None):
        return [Warning(
            "CELERY_ZSCHED_NOTIFY_MAIL is on but ADMINS is empty: mail_admins sends nothing",
            hint="List the people to notify in ADMINS.", id="zsched.W002")]
    return []
