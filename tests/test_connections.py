"""Connection settings: Sentinel URLs, TLS options, the broker fallback, and their errors."""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from redis.sentinel import MasterNotFoundError, SlaveNotFoundError

from celery_zsched.config import Settings
from celery_zsched.core.errors import ConfigurationError, StoreUnavailable
from celery_zsched.core.job import Job
from celery_zsched.store import Store
from celery_zsched.store.connection import parse_sentinel_url, redis_client, ssl_kwargs
from celery_zsched.store.errors import redis_unavailable
from tests.docs_pages import page

#: The settings this module covers (each must be in the configuration reference's table).
CONNECTION_SETTINGS = ("sentinel_master", "sentinel_username", "sentinel_password", "redis_ssl",
                       "redis_ssl_ca_certs", "redis_ssl_certfile", "redis_ssl_keyfile",
                       "redis_ssl_cert_reqs")


def settings(**values: Any) -> Settings:
    return Settings.from_mapping({f"zsched_{k}": v for k, v in values.items()}, env={})


@pytest.fixture
def pem(tmp_path: Path) -> str:
    """A file that exists (the checks look for the file, not into it)."""
    path = tmp_path / "x.pem"
    path.write_text("not really a certificate\n")
    return str(path)


# ---------------------------------------------------------------- Sentinel URLs
def test_kombu_sentinel_url_parses_hosts_credentials_and_db() -> None:
    parsed = parse_sentinel_url(
        "sentinel://user:p%40ss@10.0.0.1:26380/3;sentinel://10.0.0.2;sentinel://[::1]:5000")
    assert parsed.sentinels == (("10.0.0.1", 26380), ("10.0.0.2", 26379), ("::1", 5000))
    assert (parsed.username, parsed.password, parsed.db) == ("user", "p@ss", 3)
    only_password = parse_sentinel_url("sentinel://:secret@h:1;sentinel://h2:2/")
    assert (only_password.username, only_password.password, only_password.db) == (
        None, "secret", 0)


@pytest.mark.parametrize("url, fragment", [
    ("sentinel://h:1;redis://h:2", "'redis://h:2' is not a sentinel://host:port URL"),
    ("sentinel://h:1/x", "database 'x'"),
    ("sentinel://h:99999", "bad sentinel URL part"),
    ("sentinel://h:1?ssl_cert_reqs=none", "takes no query"),
    ("sentinel://;", "'sentinel://' is not a sentinel://host:port URL"),
])
def test_bad_sentinel_url_is_an_error_naming_the_setting(url: str, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match="zsched_redis_url") as info:
        settings(redis_url=url, sentinel_master="m")
    assert fragment in str(info.value)


def test_empty_sentinel_list_is_an_error() -> None:
    with pytest.raises(ConfigurationError, match="zsched_redis_url: no Sentinel"):
        parse_sentinel_url(" ; ")


def test_sentinel_url_without_master_name_is_an_error_naming_the_setting() -> None:
    with pytest.raises(ConfigurationError, match="zsched_sentinel_master is required"):
        settings(redis_url="sentinel://127.0.0.1:26379")


def test_sentinel_url_with_cluster_is_an_error() -> None:
    with pytest.raises(ConfigurationError, match="zsched_redis_cluster cannot be combined"):
        settings(redis_url="sentinel://h:1", sentinel_master="m", redis_cluster=True)


@pytest.mark.parametrize("name", ["sentinel_master", "sentinel_username", "sentinel_password"])
def test_sentinel_settings_without_a_sentinel_url_are_an_error(name: str) -> None:
    with pytest.raises(ConfigurationError, match=f"zsched_{name} is set but zsched_redis_url"):
        settings(redis_url="redis://h:6379/0", **{name: "x"})


def test_sentinel_master_comes_from_the_environment() -> None:
    got = Settings.from_mapping({"zsched_redis_url": "sentinel://h:1"},
                                env={"ZSCHED_SENTINEL_MASTER": "mymaster"})
    assert got.sentinel_master == "mymaster"


# ------------------------------------------------------------------------- TLS
@pytest.mark.parametrize("name", ["redis_ssl_ca_certs", "redis_ssl_certfile",
                                  "redis_ssl_keyfile"])
def test_missing_certificate_file_is_an_error_naming_the_setting(
        name: str, tmp_path: Path, pem: str) -> None:
    missing = str(tmp_path / "nope.pem")
    extra = {"redis_ssl_certfile": pem} if name == "redis_ssl_keyfile" else {}
    with pytest.raises(ConfigurationError, match=f"zsched_{name}: no such file: .*nope.pem"):
        settings(redis_url="rediss://h:6380/0", **extra, **{name: missing})


def test_missing_certificate_file_in_the_url_query_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError,
                       match=r"zsched_redis_url: ssl_ca_certs: no such file: .*nope\.pem"):
        settings(redis_url=f"rediss://h:6380/0?ssl_ca_certs={tmp_path / 'nope.pem'}")


@pytest.mark.parametrize("where", ["setting", "url"])
def test_unknown_cert_reqs_is_an_error_naming_the_setting(where: str) -> None:
    if where == "setting":
        name, values = "zsched_redis_ssl_cert_reqs", {"redis_ssl_cert_reqs": "sometimes"}
        values["redis_url"] = "rediss://h:6380/0"
    else:
        name, values = "zsched_redis_url", {"redis_url": "rediss://h/0?ssl_cert_reqs=sometimes"}
    with pytest.raises(ConfigurationError, match=name) as info:
        settings(**values)
    assert "none, optional, required" in str(info.value) and "'sometimes'" in str(info.value)


def test_keyfile_without_certfile_is_an_error(pem: str) -> None:
    with pytest.raises(ConfigurationError,
                       match="zsched_redis_ssl_keyfile needs zsched_redis_ssl_certfile"):
        settings(redis_url="rediss://h:6380/0", redis_ssl_keyfile=pem)


def test_tls_options_without_tls_are_an_error(pem: str) -> None:
    with pytest.raises(ConfigurationError, match="zsched_redis_ssl_ca_certs is set but the "
                                                 "connection does not use TLS"):
        settings(redis_url="redis://h:6379/0", redis_ssl_ca_certs=pem)
    # zsched_redis_ssl upgrades a redis:// URL instead.
    assert settings(redis_url="redis://h:6379/0", redis_ssl_ca_certs=pem, redis_ssl=True)
    with pytest.raises(ConfigurationError, match="zsched_redis_ssl: TLS over a unix://"):
        settings(redis_url="unix:///tmp/redis.sock", redis_ssl=True)


def test_tls_settings_become_redis_py_keywords(pem: str) -> None:
    got = settings(redis_url="rediss://h:6380/0", redis_ssl_ca_certs=pem,
                   redis_ssl_certfile=pem, redis_ssl_keyfile=pem,
                   redis_ssl_cert_reqs="REQUIRED")
    assert ssl_kwargs(got) == {"ssl_ca_certs": pem, "ssl_certfile": pem, "ssl_keyfile": pem,
                               "ssl_cert_reqs": "required"}
    client = redis_client(got)
    try:
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["ssl_ca_certs"] == pem and kwargs["ssl_cert_reqs"] == "required"
        assert client.connection_pool.connection_class is redis.SSLConnection
    finally:
        client.close()


def test_redis_ssl_upgrades_a_redis_url_and_the_url_query_wins(pem: str, tmp_path: Path) -> None:
    other = tmp_path / "other.pem"
    other.write_text("x")
    got = settings(redis_url=f"redis://h:6380/0?ssl_ca_certs={other}", redis_ssl=True,
                   redis_ssl_ca_certs=pem)
    client = redis_client(got)
    try:
        assert client.connection_pool.connection_class is redis.SSLConnection
        assert client.connection_pool.connection_kwargs["ssl_ca_certs"] == str(other)
    finally:
        client.close()


def test_sentinel_client_takes_tls_and_credentials(pem: str) -> None:
    got = settings(redis_url="sentinel://u:pw@127.0.0.1:1/2;sentinel://127.0.0.1:2",
                   sentinel_master="m", sentinel_password="spw", redis_ssl=True,
                   redis_ssl_ca_certs=pem)
    client = redis_client(got)
    try:
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        assert (kwargs["username"], kwargs["password"], kwargs["db"]) == ("u", "pw", 2)
        assert kwargs["ssl_ca_certs"] == pem
        assert pool.connection_class.__name__ == "SentinelManagedSSLConnection"
        manager = pool.sentinel_manager
        assert [s.connection_pool.connection_kwargs["port"] for s in manager.sentinels] == [1, 2]
        on_sentinel = manager.sentinels[0].connection_pool
        assert on_sentinel.connection_kwargs["password"] == "spw"
        assert on_sentinel.connection_class is redis.SSLConnection
    finally:
        client.close()


# ------------------------------------------------------------ broker fallback
def test_sentinel_broker_and_its_master_name_are_reused() -> None:
    app = Celery("t", set_as_current=False)
    app.conf.update(
        broker_url="sentinel://:pw@127.0.0.1:26379/4;sentinel://127.0.0.1:26380",
        broker_transport_options={"master_name": "mymaster",
                                  "sentinel_kwargs": {"password": "spw"}})
    got = Settings.from_app(app)
    assert got.redis_url == app.conf.broker_url
    assert (got.sentinel_master, got.sentinel_password) == ("mymaster", "spw")
    explicit = Settings(sentinel_master="mine").with_broker_fallback(
        app.conf.broker_url, app.conf.broker_transport_options)
    assert explicit.sentinel_master == "mine"


def test_sentinel_broker_without_master_name_is_an_error() -> None:
    with pytest.raises(ConfigurationError, match="zsched_sentinel_master is required"):
        Settings().with_broker_fallback("sentinel://127.0.0.1:26379", {})


def test_broker_use_ssl_is_reused_with_a_rediss_broker(pem: str) -> None:
    app = Celery("t", set_as_current=False)
    app.conf.update(broker_url="rediss://127.0.0.1:6380/0",
                    broker_use_ssl={"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": pem,
                                    "ssl_certfile": pem, "ssl_keyfile": pem})
    got = Settings.from_app(app)
    assert (got.redis_url, got.redis_ssl_cert_reqs, got.redis_ssl_ca_certs) == (
        "rediss://127.0.0.1:6380/0", "required", pem)
    assert got.redis_ssl_keyfile == got.redis_ssl_certfile == pem
    # A sentinel broker with broker_use_ssl talks TLS to the Sentinels and the master.
    sentinel = Settings().with_broker_fallback("sentinel://h:1", {"master_name": "m"},
                                               {"ssl_cert_reqs": ssl.CERT_NONE})
    assert sentinel.redis_ssl and sentinel.redis_ssl_cert_reqs == "none"
    # Not a Redis broker: neither its URL nor its TLS options are used.
    amqp = Settings().with_broker_fallback("amqps://h//", None, {"ca_certs": pem})
    assert amqp.redis_url == "redis://localhost:6379/0" and not amqp.redis_ssl_ca_certs


# ----------------------------------------------------------- failover errors
@pytest.mark.parametrize("error", [
    MasterNotFoundError("No master found for 'm'"), SlaveNotFoundError("none"),
    redis.exceptions.ReadOnlyError("READONLY You can't write against a read only replica."),
    redis.exceptions.BusyLoadingError("LOADING Redis is loading the dataset in memory"),
    redis.exceptions.MasterDownError("MASTERDOWN Link with MASTER is down"),
    redis.ConnectionError("The previous master is now a slave"),
])
def test_failover_errors_are_store_unavailable(error: Exception) -> None:
    with pytest.raises(StoreUnavailable), redis_unavailable():
        raise error


# -------------------------------------------------------------- the documentation
def test_readme_documents_every_connection_setting() -> None:
    reference = page("reference/configuration.md")
    for name in CONNECTION_SETTINGS:
        assert name in Settings.names()
        row = re.search(rf"^\| `zsched_{name}` \| `ZSCHED_{name.upper()}` \|", reference, re.M)
        assert row, f"zsched_{name} is not in the configuration reference"
    assert "# Sentinel, TLS and ACL" in page("how-to/connections.md")


def test_a_master_that_may_not_write_is_an_outage_not_an_error(
        make_store: Callable[..., Store], rclient: redis.Redis) -> None:
    store = make_store(partitions=4)
    store.upsert(_noop("nr1"))
    rclient.config_set("min-replicas-to-write", 1)  # this server has no replica
    try:
        with pytest.raises(StoreUnavailable, match="NOREPLICAS"):
            store.claim(10)
        with pytest.raises(StoreUnavailable, match="NOREPLICAS"):
            store.upsert(_noop("nr2"))
    finally:
        rclient.config_set("min-replicas-to-write", 0)
    assert store.get_many(["nr1", "nr2"])[1] is None  # nothing was half-written
    assert store.claim(10).now_ms > 0


def _noop(job_id: str) -> Job:
    return Job.from_dict({"id": job_id, "task": "tests.noop", "interval_s": 60})
