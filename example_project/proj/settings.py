"""Settings of the celery-zsched example project.

Everything a deployment changes comes from the environment:

- ``REDIS_URL`` (default ``redis://127.0.0.1:6379/0``): the Celery broker and
  the zsched store. ``demo.py`` starts a throwaway redis-server and sets it.
- ``DATABASE_URL`` (default: SQLite in ``example_project/db.sqlite3``), for
  example ``postgres://user:password@127.0.0.1:5432/zsched`` (needs psycopg).
- ``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG`` (default on: this is a demo).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-not-a-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
# The fake sites answer on loopback addresses besides 127.0.0.1 (scrapers/hosts.py):
# allow the whole 127.0.0.x range rather than keep two lists in step.
ALLOWED_HOSTS = ["localhost", "testserver", *(f"127.0.0.{i}" for i in range(1, 255))]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "celery_zsched.contrib.django",
    "scrapers",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "proj.urls"
WSGI_APPLICATION = "proj.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def database_from_url(url: str) -> dict[str, Any]:
    """A ``DATABASES`` entry from ``postgres://user:pw@host:port/name`` or ``sqlite:///path``.

    A dozen lines instead of a dependency on dj-database-url.
    """
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3",
                "NAME": unquote(parts.path[1:]) or ":memory:"}
    if parts.scheme in ("postgres", "postgresql", "pgsql"):
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parts.path.lstrip("/")),
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
        }
    raise ValueError(f"DATABASE_URL: unsupported scheme {parts.scheme!r} (postgres or sqlite)")


DATABASES = {
    "default": database_from_url(os.environ["DATABASE_URL"]) if os.environ.get("DATABASE_URL")
    else {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"},
}
# SQLite under a threaded runserver plus admin writes: wait for the lock
# instead of failing at once with "database is locked".
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"]["OPTIONS"] = {"timeout": 20}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

# ------------------------------------------------------------------ Celery
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

CELERY_BROKER_URL = REDIS_URL
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = TIME_ZONE
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = True

# ------------------------------------------------------------------ zsched
# Read by beat, the worker's settle hooks and the Django app alike.
CELERY_ZSCHED_REDIS_URL = REDIS_URL
CELERY_ZSCHED_DEFAULT_TASK = "scrapers.tasks.scrape"
# Short retries, so the demo's failing targets show their backoff within minutes.
CELERY_ZSCHED_RETRY_BASE_S = 10.0
CELERY_ZSCHED_RETRY_MAX = 2
# Politeness: each site (the host of a job's URL) gets at most one request in
# flight and one second between two request starts, however many of its jobs
# are due. Its 429s, Retry-After and failures slow it down further or open its
# breaker; see `celery -A proj zsched domains`. The env (ZSCHED_PACING=0, ...)
# overrides these, as every zsched setting.
CELERY_ZSCHED_PACING = True
CELERY_ZSCHED_DOMAIN_DELAY_S = 1.0
CELERY_ZSCHED_DOMAIN_MAX_IN_FLIGHT = 1
# A site's breaker opens when 80 % of its requests in a minute failed (default
# 50 %). A site that is down fails nearly all; a healthy one whose few broken
# pages fail and retry in a burst (three tries each) can pass 50 % for a minute.
CELERY_ZSCHED_BREAKER_RATIO = 0.8

# The REST API of `celery -A proj zsched serve` (demo.py starts it): a token per
# scope. Demo values on a loopback port; a deployment sets its own secrets, e.g.
# through ZSCHED_API_TOKENS.
CELERY_ZSCHED_API_TOKENS = "demo-write-token-0001:write,demo-read-token-00001:read"

# Static entries are imported into the zsched store when beat starts, so the
# maintenance tasks run through the same scheduler as the scrape jobs.
CELERY_BEAT_SCHEDULE = {
    # Copies settle events into the admin's run history (and the mirror fields).
    "zsched-drain-history": {
        "task": "celery_zsched.contrib.django.tasks.drain_history",
        "schedule": 15.0,
    },
    # Repairs whatever the on-commit pushes could not see (bulk SQL, a Redis restart).
    "zsched-reconcile": {
        "task": "celery_zsched.contrib.django.tasks.reconcile",
        "schedule": 600.0,
    },
}
