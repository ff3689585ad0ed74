"""Settings from CELERY_ZSCHED_*, the django-redis alias connection path, checks and tasks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import redis
from django.core.checks import run_checks

from celery_zsched.config import Settings
from celery_zsched.contrib.django import conf, tasks
from celery_zsched.contrib.django.apps import ZSchedConfig
from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.core.errors import ConfigurationError


def _check_ids() -> set[str]:
    return {m.id for m in run_checks() if m.id and m.id.startswith("zsched.")}


def test_app_config_pins_label_and_auto_field() -> None:
    assert ZSchedConfig.label == "zsched"
    assert ZSchedConfig.default_auto_field == "django.db.models.BigAutoField"
    assert ZSchedJob._meta.db_table == "zsched_job"


def test_celery_zsched_settings_map_to_core_settings(settings: Any) -> None:
    settings.CELERY_ZSCHED_BATCH_SIZE = 77
    settings.CELERY_ZSCHED_HISTORY_DAYS = 9
    settings.CELERY_ZSCHED_DEFAULT_TASK = "tasks.fetch"
    got = conf.get_settings()
    assert (got.batch_size, got.default_task) == (77, "tasks.fetch")
    assert conf.get_django_settings().history_days == 9
    assert conf.get_defaults().timezone == "Europe/Berlin"
    assert conf.get_store().defaults.timezone == "Europe/Berlin"
    assert conf.get_settings() is got, "cached until a setting changes"


def test_unknown_setting_is_an_error_and_a_failing_check(settings: Any) -> None:
    settings.CELERY_ZSCHED_BATCH_SIZ = 5
    with pytest.raises(ConfigurationError, match="zsched_batch_siz"):
        conf.get_settings()
    assert "zsched.E001" in _check_ids()


def test_history_days_is_a_django_setting_that_beat_accepts(settings: Any) -> None:
    """The Django app owns and validates it; beat's core settings accept it in the shared
    CELERY_ZSCHED_* namespace without knowing it."""
    assert not hasattr(Settings.from_mapping({"zsched_history_days": "3"}, env={}),
                       "history_days")
    settings.CELERY_ZSCHED_HISTORY_DAYS = "3"
    assert conf.DjangoSettings.from_django(env={}).history_days == 3
    assert conf.DjangoSettings.from_django(env={"ZSCHED_HISTORY_DAYS": "5"}).history_days == 5
    settings.CELERY_ZSCHED_HISTORY_DAYS = -1
    with pytest.raises(ConfigurationError, match="zsched_history_days"):
        conf.DjangoSettings.from_django(env={})
    assert "zsched.E001" in _check_ids()


def test_url_falls_back_to_a_redis_broker_url(settings: Any) -> None:
    del settings.CELERY_ZSCHED_REDIS_URL
    settings.CELERY_BROKER_URL = "redis://broker.invalid:6379/3"
    assert conf.get_settings().redis_url == "redis://broker.invalid:6379/3"
    settings.CELERY_BROKER_URL = "amqp://guest@rabbit.invalid//"
    assert conf.get_settings().redis_url == "redis://localhost:6379/0"


@pytest.mark.django_db(transaction=True)
def test_redis_alias_connection_path(settings: Any, rclient: redis.Redis,
                                     make_row: Callable[..., ZSchedJob]) -> None:
    # No URL setting (the fallback, localhost:6379, must not be used): only the
    # alias reaches the throwaway server.
    del settings.CELERY_ZSCHED_REDIS_URL
    settings.CELERY_ZSCHED_REDIS_ALIAS = "zsched"
    settings.CACHES = {**settings.CACHES, "zsched": {
        **settings.CACHES["zsched"], "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 3}}}
    client = conf.get_client()
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["decode_responses"] is True
    assert kwargs["socket_connect_timeout"] == 3
    store = conf.get_store()
    row = make_row(1)
    assert store.get(row.job_id).job.url == row.url
    assert rclient.hexists(store.keys.defs, row.job_id)
    # The cache itself still works on its own (bytes) pool.
    from django.core.cache import caches
    caches["zsched"].set("k", {"v": 1})
    assert caches["zsched"].get("k") == {"v": 1}
    assert "zsched.W001" in _check_ids()


def test_alias_that_is_not_django_redis_is_rejected(settings: Any) -> None:
    settings.CELERY_ZSCHED_REDIS_ALIAS = "default"
    with pytest.raises(ConfigurationError, match="not a django-redis cache"):
        conf.get_client()
    assert "zsched.E002" in _check_ids()
    settings.CELERY_ZSCHED_REDIS_ALIAS = "missing"
    with pytest.raises(ConfigurationError, match="no cache named"):
        conf.get_client()


def test_importing_the_app_reads_no_settings_and_connects_nowhere() -> None:
    # A fresh interpreter with no settings at all: any read at import time
    # would raise ImproperlyConfigured.
    code = ("import celery_zsched.contrib.django.apps, celery_zsched.contrib.django.conf, "
            "celery_zsched.contrib.django.tasks; from django.conf import settings; "
            "assert not settings.configured")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


@pytest.mark.django_db(transaction=True)
def test_maintenance_tasks_run(make_row: Callable[..., ZSchedJob]) -> None:
    ZSchedJob.objects.bulk_create([ZSchedJob(job_id="a", task="t", interval_s=5)])
    result = tasks.reconcile.run()
    assert result["missing"] == 1 and result["dry_run"] is False
    assert tasks.drain_history.run()["read"] == 0
    assert tasks.reconcile.name == "celery_zsched.contrib.django.tasks.reconcile"
    assert tasks.drain_history.name == "celery_zsched.contrib.django.tasks.drain_history"
