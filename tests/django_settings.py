"""Django settings of the test suite (``DJANGO_SETTINGS_MODULE = "tests.django_settings"``).

SQLite by default; PostgreSQL (or any URL below) when ``DATABASE_URL`` is set,
as in the ``django-postgres`` tox env. Redis points nowhere useful here on
purpose: the ``zsched_redis`` fixture of ``tests/conftest.py`` points the
cache alias and the store at the throwaway redis-server of each test session,
so no test can reach a developer's Redis on 6379.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit


def database_from_url(url: str) -> dict[str, Any]:
    """A ``DATABASES`` entry from ``postgres://user:pass@host:port/name`` or ``sqlite:///path``."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": parts.path[1:] or ":memory:"}
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise ValueError(f"DATABASE_URL: unsupported scheme {parts.scheme!r}")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


SECRET_KEY = "celery-zsched-tests-only"
DEBUG = False
USE_TZ = True
# Not UTC, so tests see that jobs inherit TIME_ZONE as their default zone.
TIME_ZONE = "Europe/Berlin"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "celery_zsched.contrib.django",
    # The real models `zsched_import --from django-celery-beat` reads
    # (tests/django/test_dj_migrate_sources.py).
    "django_celery_beat",
]
DATABASES = {
    "default": database_from_url(os.environ["DATABASE_URL"])
    if os.environ.get("DATABASE_URL")
    else {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
# Port 1 refuses at once: a test that forgets the fixture fails instead of
# touching a real Redis.
_NOWHERE = "redis://127.0.0.1:1/0"
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "zsched": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": _NOWHERE},
}
CELERY_ZSCHED_REDIS_URL = _NOWHERE
CELERY_ZSCHED_HISTORY_DAYS = 30

# The admin (tests/django/test_admin.py, tests/browser/): its apps, middleware
# and templates. Each admin test module routes URLs itself (pytest.mark.urls).
INSTALLED_APPS += [
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
STATIC_URL = "/static/"
ROOT_URLCONF = "tests.django.admin_urls"
