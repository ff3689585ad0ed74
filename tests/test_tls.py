"""The store over TLS: a redis-server with ``--tls-port`` and a CA made by the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_zsched.config import Settings
from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.core.job import Job
from celery_zsched.store import Store
from tests.servers import Certs, RedisServer, make_certs, running, tls_server


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_redis(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A TLS-only redis-server that requires a client certificate signed by the test CA."""
    with running(tls_server(tmp_path_factory.mktemp("tls-redis"), certs)) as (server,):
        yield server


def tls_settings(server: RedisServer, certs: Certs, **overrides: Any) -> Settings:
    conf = {"zsched_redis_url": server.url(), "zsched_redis_ssl_ca_certs": str(certs.ca),
            "zsched_redis_ssl_certfile": str(certs.client_cert),
            "zsched_redis_ssl_keyfile": str(certs.client_key),
            "zsched_redis_ssl_cert_reqs": "required"}
    conf.update({f"zsched_{k}": v for k, v in overrides.items()})
    return Settings.from_mapping({k: v for k, v in conf.items() if v is not None}, env={})


def round_trip(store: Store) -> None:
    """Upsert, claim, settle, and read the stats back."""
    job = Job.from_dict({"url": "http://127.0.0.1:1/tls", "interval_s": 10})
    assert store.upsert(job).created == 1
    batch = store.claim()
    assert [c.job.id for c in batch.jobs] == [job.id]
    claimed = batch.jobs[0]
    result = store.settle(job.id, claimed.occurrence, claimed.attempt, "complete")
    assert result.applied and result.status == "scheduled"
    assert store.stats()["jobs"] == 1
    assert store.get(job.id).state.last_outcome == "complete"


def test_store_round_trip_over_tls_with_a_client_certificate(
        tls_redis: RedisServer, certs: Certs) -> None:
    store = Store.from_settings(tls_settings(tls_redis, certs, key_prefix="{tls1}:"))
    try:
        round_trip(store)
        assert store.client.connection_pool.connection_kwargs["ssl_cert_reqs"] == "required"
    finally:
        store.client.close()


def test_tls_options_in_the_url_query(tls_redis: RedisServer, certs: Certs) -> None:
    url = (f"{tls_redis.url()}?ssl_ca_certs={certs.ca}&ssl_certfile={certs.client_cert}"
           f"&ssl_keyfile={certs.client_key}&ssl_cert_reqs=required")
    settings = Settings.from_mapping({"zsched_redis_url": url, "zsched_key_prefix": "{tls2}:"},
                                     env={})
    store = Store.from_settings(settings)
    try:
        round_trip(store)
    finally:
        store.client.close()


def test_redis_ssl_setting_upgrades_a_redis_url(tls_redis: RedisServer, certs: Certs) -> None:
    url = tls_redis.url().replace("rediss://", "redis://")
    store = Store.from_settings(tls_settings(tls_redis, certs, redis_url=url, redis_ssl=True,
                                             key_prefix="{tls3}:"))
    try:
        round_trip(store)
    finally:
        store.client.close()


def test_a_server_signed_by_another_ca_is_refused_with_a_clear_error(
        tls_redis: RedisServer, certs: Certs) -> None:
    settings = tls_settings(tls_redis, certs, redis_ssl_ca_certs=str(certs.other_ca))
    store = Store.from_settings(settings)
    try:
        with pytest.raises(StoreUnavailable, match="certificate verify failed"):
            store.now_ms()
    finally:
        store.client.close()


def test_a_client_without_certificate_is_refused(tls_redis: RedisServer, certs: Certs) -> None:
    settings = tls_settings(tls_redis, certs, redis_ssl_certfile=None, redis_ssl_keyfile=None)
    store = Store.from_settings(settings)
    try:
        with pytest.raises(StoreUnavailable):
            store.now_ms()
    finally:
        store.client.close()


def test_cert_reqs_none_skips_the_server_check(tmp_path: Path, certs: Certs) -> None:
    # A server that asks no client certificate, reached without trusting its CA.
    with running(tls_server(tmp_path, certs, auth_clients=False)) as (server,):
        settings = Settings.from_mapping({"zsched_redis_url": server.url(),
                                          "zsched_redis_ssl_cert_reqs": "none"}, env={})
        store = Store.from_settings(settings)
        try:
            round_trip(store)
        finally:
            store.client.close()
