"""The store through Sentinel: a real master, replica and Sentinel, and a failover under it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from celery_zsched.config import Settings
from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.core.job import Job
from celery_zsched.store import Store
from tests.servers import SentinelGroup, make_certs, sentinel_group

T = TypeVar("T")


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    with sentinel_group(tmp_path_factory.mktemp("sentinel")) as started:
        yield started


def sentinel_store(group: SentinelGroup, prefix: str, **overrides: Any) -> Store:
    conf = {"zsched_redis_url": group.url, "zsched_sentinel_master": group.name,
            "zsched_key_prefix": prefix, **{f"zsched_{k}": v for k, v in overrides.items()}}
    return Store.from_settings(Settings.from_mapping(conf, env={}))


def retried(call: Callable[[], T], timeout: float = 30) -> tuple[T, int]:
    """``call()`` retried while it raises StoreUnavailable, as beat and workers do; (result,
    number of StoreUnavailable seen). Any other exception fails the test."""
    deadline = time.monotonic() + timeout
    outages = 0
    while True:
        try:
            return call(), outages
        except StoreUnavailable:
            outages += 1
            assert time.monotonic() < deadline, "the store did not come back"
            time.sleep(0.2)


def test_store_round_trip_through_sentinel(group: SentinelGroup) -> None:
    store = sentinel_store(group, "{sent1}:")
    try:
        job = Job.from_dict({"url": "http://127.0.0.1:1/s", "interval_s": 10})
        assert store.upsert(job).created == 1
        batch = store.claim()
        claimed = batch.jobs[0]
        assert store.settle(job.id, claimed.occurrence, claimed.attempt, "complete").applied
        # It really is the master that the Sentinel names.
        with (group.master if group.master_port() == group.master.port
              else group.replica).admin() as master:
            assert master.hexists(store.keys.defs, job.id)
    finally:
        store.client.close()


def test_an_unknown_master_name_is_an_outage_not_a_crash(group: SentinelGroup) -> None:
    store = sentinel_store(group, "{sent2}:", sentinel_master="no-such-master")
    try:
        with pytest.raises(StoreUnavailable, match="No master found for 'no-such-master'"):
            store.now_ms()
    finally:
        store.client.close()


def test_a_claimed_occurrence_settles_on_the_new_master_after_a_failover(
        group: SentinelGroup) -> None:
    """SENTINEL FAILOVER demotes the old master (READONLY) while the store holds connections."""
    store = sentinel_store(group, "{sent3}:")
    try:
        job = Job.from_dict({"url": "http://127.0.0.1:1/f", "interval_s": 10})
        store.upsert(job)
        claimed = store.claim().jobs[0]
        group.wait_ready()
        old = group.master_port()
        with group.sentinel.admin() as sentinel:
            assert sentinel.sentinel_failover(group.name)
        new = group.wait_failover(old)
        # The demoted master answers READONLY (or closes the connection) until
        # the client asks the Sentinel again; either is StoreUnavailable.
        result, outages = retried(lambda: store.settle(
            job.id, claimed.occurrence, claimed.attempt, "complete"))
        assert result.applied and result.status == "scheduled"
        assert group.master_port() == new
        info, _ = retried(lambda: store.get(job.id))
        assert info.state.last_outcome == "complete"
        print(f"failover {old} -> {new}: {outages} StoreUnavailable before the settle applied")
    finally:
        store.client.close()


def test_sentinel_over_tls_and_a_failover(tmp_path: Path) -> None:
    """Sentinels, master and replica on TLS only: the store follows the master over TLS."""
    certs = make_certs(tmp_path / "certs")
    with sentinel_group(tmp_path / "tls", certs=certs) as tls_group:
        store = sentinel_store(tls_group, "{sent4}:", redis_ssl=True,
                               redis_ssl_ca_certs=str(certs.ca),
                               redis_ssl_certfile=str(certs.client_cert),
                               redis_ssl_keyfile=str(certs.client_key))
        try:
            job = Job.from_dict({"url": "http://127.0.0.1:1/t", "interval_s": 10})
            tls_group.wait_ready()
            store.upsert(job)
            # The job itself must survive the failover (only the claim may be lost to
            # asynchronous replication): wait until the replica has it.
            assert store.client.execute_command("WAIT", 1, 5000) >= 1
            claimed = store.claim().jobs[0]
            old = tls_group.master_port()
            tls_group.master.stop()  # SIGKILL
            new = tls_group.wait_failover(old)
            result, _ = retried(lambda: store.settle(
                job.id, claimed.occurrence, claimed.attempt, "complete"))
            assert new == tls_group.replica.port
            # The settle either applied, or replication lost the claim and the
            # occurrence is back in the schedule: never a crash, never a fork.
            info, _ = retried(lambda: store.get(job.id))
            assert result.applied or info.state.status == "scheduled", (result, info.state)
        finally:
            store.client.close()
