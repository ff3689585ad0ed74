"""The Django app connects as beat does: Sentinel URLs and a Sentinel broker's master name."""

from __future__ import annotations

from typing import Any

from redis.sentinel import SentinelConnectionPool

from celery_zsched.contrib.django import conf


def test_django_store_client_goes_through_sentinel(settings: Any) -> None:
    settings.CELERY_ZSCHED_REDIS_URL = "sentinel://:pw@127.0.0.1:1/2;sentinel://127.0.0.1:2"
    settings.CELERY_ZSCHED_SENTINEL_MASTER = "mymaster"
    client = conf.get_client()
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "mymaster"
    assert (pool.connection_kwargs["password"], pool.connection_kwargs["db"]) == ("pw", 2)
    assert pool.connection_kwargs["decode_responses"] is True


def test_django_reuses_a_sentinel_broker_and_its_master_name(settings: Any) -> None:
    del settings.CELERY_ZSCHED_REDIS_URL
    settings.CELERY_BROKER_URL = "sentinel://127.0.0.1:26379/4"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"master_name": "brokermaster"}
    got = conf.get_settings()
    assert (got.redis_url, got.sentinel_master) == ("sentinel://127.0.0.1:26379/4",
                                                    "brokermaster")
