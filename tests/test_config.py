"""Settings: defaults, Celery ``zsched_*`` settings, ``ZSCHED_*`` env overrides, validation."""

from __future__ import annotations

import dataclasses
import os

import pytest
from celery import Celery

from celery_zsched.config import Settings
from celery_zsched.core.errors import ConfigurationError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ZSCHED_* variable of the developer's shell leaks into these tests."""
    for name in list(os.environ):
        if name.startswith("ZSCHED_"):
            monkeypatch.delenv(name)


def _app(**conf: object) -> Celery:
    app = Celery("config-tests", set_as_current=False)
    app.conf.update(conf)
    return app


def test_defaults() -> None:
    """Every setting has its documented default."""
    s = Settings()
    assert (s.redis_url, s.key_prefix, s.batch_size, s.lease_s) == ("", "{zsched}:", 1000, 30.0)
    assert (s.delivery_timeout_s, s.max_queued, s.queued_bound, s.heartbeat_s) == (
        7200.0, 0, 10_000, 10.0)
    assert (s.publish_timeout_s, s.gateway_lease_s) == (30.0, 60.0)
    assert (s.max_jitter_s, s.default_interval_s, s.default_task) == (0.0, 300.0, "scrape")
    assert (s.retry_max, s.retry_base_s, s.retry_cap_s) == (3, 30.0, 3600.0)
    assert (s.max_deliveries, s.misfire_grace_s, s.events_maxlen, s.import_chunk) == (
        5, 0.0, 100_000, 5000)
    assert Settings.from_mapping({}, env={}) == s
    assert set(Settings.names()) == {f.name for f in dataclasses.fields(Settings)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.batch_size = 5  # type: ignore[misc]


def test_celery_settings_are_read_from_the_app() -> None:
    """Lowercase zsched_* Celery settings reach Settings.from_app, coerced to their types."""
    app = _app(zsched_batch_size=50, zsched_lease_s="12.5", zsched_key_prefix="{mine}:",
               zsched_redis_url="redis://cache:6380/2", zsched_retry_max=None,
               task_default_queue="other")
    s = Settings.from_app(app)
    assert (s.batch_size, s.lease_s, s.key_prefix, s.redis_url) == (
        50, 12.5, "{mine}:", "redis://cache:6380/2")
    assert s.retry_max == 3, "None means: keep the default"


def test_environment_override_wins_over_the_celery_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ZSCHED_BATCH_SIZE beats zsched_batch_size."""
    monkeypatch.setenv("ZSCHED_BATCH_SIZE", "99")
    monkeypatch.setenv("ZSCHED_MISFIRE_GRACE_S", "2.5")
    s = Settings.from_app(_app(zsched_batch_size=50))
    assert (s.batch_size, s.misfire_grace_s) == (99, 2.5)
    assert Settings.from_mapping({"zsched_batch_size": 5}, env={"ZSCHED_BATCH_SIZE": "6"}
                                 ).batch_size == 6


def test_unknown_zsched_setting_is_an_error_naming_it() -> None:
    """A typo in a zsched_* name never passes silently."""
    with pytest.raises(ConfigurationError, match="zsched_bacth_size"):
        Settings.from_app(_app(zsched_bacth_size=5))


@pytest.mark.parametrize(
    ("conf", "env", "named"),
    [
        ({"zsched_batch_size": "many"}, {}, "zsched_batch_size"),
        ({"zsched_batch_size": 0}, {}, "zsched_batch_size"),
        ({"zsched_lease_s": -1}, {}, "zsched_lease_s"),
        ({"zsched_max_jitter_s": -0.5}, {}, "zsched_max_jitter_s"),
        ({"zsched_retry_max": True}, {}, "zsched_retry_max"),
        ({}, {"ZSCHED_LEASE_S": "soon"}, "ZSCHED_LEASE_S"),
        ({}, {"ZSCHED_MAX_DELIVERIES": "0"}, "zsched_max_deliveries"),
    ],
    ids=["not a number", "zero batch", "negative lease", "negative jitter", "bool for int",
         "bad env value", "env zero"],
)
def test_bad_value_is_an_error_naming_the_setting(
    conf: dict[str, object], env: dict[str, str], named: str,
) -> None:
    """A value of the wrong type or range raises ConfigurationError naming its setting."""
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_mapping(conf, env=env)
    assert named in str(caught.value)


def test_bad_env_value_fails_from_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment is validated as strictly as the Celery settings."""
    monkeypatch.setenv("ZSCHED_BATCH_SIZE", "lots")
    with pytest.raises(ConfigurationError, match="ZSCHED_BATCH_SIZE"):
        Settings.from_app(_app())


@pytest.mark.parametrize(
    ("broker", "expected"),
    [
        ("redis://broker-host:6379/3", "redis://broker-host:6379/3"),
        ("rediss://:secret@broker-host:6380/1", "rediss://:secret@broker-host:6380/1"),
        ("amqp://guest@rabbit//", "redis://localhost:6379/0"),
        (None, "redis://localhost:6379/0"),
    ],
)
def test_redis_url_defaults_to_a_redis_broker_url(broker: str | None, expected: str) -> None:
    """Without zsched_redis_url the store uses the broker when it is Redis."""
    app = _app() if broker is None else _app(broker_url=broker)
    assert Settings.from_app(app).redis_url == expected


def test_explicit_redis_url_wins_over_the_broker() -> None:
    """zsched_redis_url is used even when the broker is Redis too."""
    app = _app(broker_url="redis://broker:6379/0", zsched_redis_url="redis://sched:6379/4")
    assert Settings.from_app(app).redis_url == "redis://sched:6379/4"


class _DjangoSettings:
    CELERY_BROKER_URL = "redis://django-broker:6379/5"
    CELERY_ZSCHED_BATCH_SIZE = 7
    CELERY_ZSCHED_KEY_PREFIX = "{dj}:"
    UNRELATED = "x"


def test_django_style_namespace_celery_settings_are_read() -> None:
    """config_from_object(obj, namespace="CELERY") with CELERY_ZSCHED_BATCH_SIZE=7 gives 7."""
    app = Celery("django-style", set_as_current=False)
    app.config_from_object(_DjangoSettings, namespace="CELERY")
    s = Settings.from_app(app)
    assert (s.batch_size, s.key_prefix) == (7, "{dj}:")
    assert s.redis_url == "redis://django-broker:6379/5"


def test_django_style_namespace_rejects_unknown_settings() -> None:
    """A misspelt CELERY_ZSCHED_* setting is an error too."""
    class Typo:
        CELERY_ZSCHED_BACTH_SIZE = 7

    app = Celery("django-typo", set_as_current=False)
    app.config_from_object(Typo, namespace="CELERY")
    with pytest.raises(ConfigurationError, match=r"(?i)zsched_bacth_size"):
        Settings.from_app(app)


def test_django_style_namespace_env_override_still_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """ZSCHED_* overrides a CELERY_ZSCHED_* setting as well."""
    monkeypatch.setenv("ZSCHED_BATCH_SIZE", "11")
    app = Celery("django-env", set_as_current=False)
    app.config_from_object(_DjangoSettings, namespace="CELERY")
    assert Settings.from_app(app).batch_size == 11
