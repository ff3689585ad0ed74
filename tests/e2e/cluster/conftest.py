"""Fixtures of the Redis Cluster tests: a real local cluster, stores and deployments on it.

The cluster (three masters, three replicas; see :mod:`tests.cluster`) is
shared by the module's tests that leave it whole; a test that kills a node
starts one of its own (``own_cluster``). Every store uses a key prefix of its
own and ``CLUSTER_PARTITIONS`` partitions, at least two on every master.
Deployments are the e2e harness's (:func:`tests.e2e.conftest.deploy`): beat
and workers are real processes pointed at the cluster, the broker stays on the
session's throwaway redis-server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_zsched.config import Settings
from celery_zsched.store import Store
from e2e.conftest import Deployment
from tests.cluster import LocalCluster, local_cluster

#: Partitions of every store here: four per master on average.
CLUSTER_PARTITIONS = 12


def unique_prefix(cluster: LocalCluster, name: str = "c") -> str:
    """A key prefix no other test uses, whose partitions every master of ``cluster`` serves."""
    return cluster.spread_prefix(name, CLUSTER_PARTITIONS)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A local cluster shared by the tests that leave it whole (SIGKILLed at the end)."""
    with local_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster of this test alone, for a test that kills or wipes a node."""
    with local_cluster(tmp_path / "own-cluster") as running:
        yield running


@pytest.fixture
def cluster_store(cluster: LocalCluster) -> Iterator[Callable[..., Store]]:
    """``make(on=None, **settings)``: a partitioned Store on ``on`` (default: the shared
    cluster) with a prefix of its own; its client is closed afterwards."""
    made: list[Store] = []

    def make(on: LocalCluster | None = None, **overrides: Any) -> Store:
        values: dict[str, Any] = {
            "redis_url": (on or cluster).url, "redis_cluster": True,
            "partitions": CLUSTER_PARTITIONS, "key_prefix": unique_prefix(on or cluster)}
        values.update(overrides)
        store = Store.from_settings(Settings(**values))
        made.append(store)
        return store

    yield make
    for store in made:
        store.client.close()


@pytest.fixture
def cluster_deploy(deploy: Callable[..., Deployment], cluster: LocalCluster
                   ) -> Callable[..., Deployment]:
    """``make(on=None, **settings)``: an e2e deployment whose store is on ``on`` (default:
    the shared cluster), with ``zsched_redis_cluster`` and the partitions set."""
    def make(on: LocalCluster | None = None, **overrides: Any) -> Deployment:
        values: dict[str, Any] = {"redis_cluster": True, "partitions": CLUSTER_PARTITIONS,
                                  "key_prefix": unique_prefix(on or cluster, "e2e")}
        values.update(overrides)
        return deploy(store_url=(on or cluster).url, **values)
    return make
