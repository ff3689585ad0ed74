"""A throwaway local Redis Cluster: three masters and three replicas on free ports.

Each node is a ``redis-server --cluster-enabled yes`` that keeps nothing on
disk, runs in a process group of its own (a replica's full sync forks a
child), and writes its cluster config and log under a directory of the test's
``tmp_path``. :func:`local_cluster` always SIGKILLs every group it started,
also when start-up or the test fails. Nothing here touches any other Redis.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from tests.helpers import bindable, wait, worker_share

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
#: ``cluster-node-timeout``: a dead master is failed over within a few seconds.
NODE_TIMEOUT_MS = 1000
#: A node also listens on port + 10000 (the cluster bus), and a port must be at
#: most 55535. Ports of 12000..22767 keep both below the kernel's ephemeral
#: range (32768 and up), where the OS hands out client ports.
_PORTS = range(12000, 22768)


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too, from this worker's share."""
    share = worker_share(_PORTS)
    for _ in range(1000):
        port = random.choice(share)
        if bindable(port) and bindable(port + 10000):
            return port
    raise AssertionError("no free port pair for a cluster node")


def require_binaries() -> tuple[str, str]:
    """``redis-server`` and ``redis-cli``, or skip the test with the reason."""
    if REDIS_SERVER is None or REDIS_CLI is None:
        missing = "redis-server" if REDIS_SERVER is None else "redis-cli"
        pytest.skip(f"{missing} is not on PATH: the Redis Cluster tests need a real cluster")
    return REDIS_SERVER, REDIS_CLI


@dataclass
class ClusterNode:
    """One cluster-enabled ``redis-server``."""

    workdir: Path
    port: int = field(default_factory=cluster_port)
    popen: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        """Its log file."""
        return self.workdir / f"node-{self.port}.log"

    @property
    def address(self) -> str:
        """``127.0.0.1:port``."""
        return f"127.0.0.1:{self.port}"

    def start(self, executable: str) -> None:
        """Start it (it answers PING once :meth:`answers`)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.popen = subprocess.Popen(
            [executable, "--port", str(self.port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes",
             "--cluster-config-file", str(self.workdir / f"nodes-{self.port}.conf"),
             "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
             "--logfile", str(self.log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        """The process has not exited."""
        return self.popen is not None and self.popen.poll() is None

    def answers(self) -> bool:
        """It is alive and answers PING."""
        if not self.alive():
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise AssertionError(f"redis-server on {self.port} exited:\n{text[-3000:]}")
        with contextlib.suppress(redis.RedisError), self.admin() as c:
            return bool(c.ping())
        return False

    def admin(self, **kwargs: Any) -> redis.Redis:
        """A plain (non-cluster) client of this node alone (close it, or use ``with``)."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1,
                           socket_timeout=5, decode_responses=True, **kwargs)

    def kill(self) -> None:
        """SIGKILL its process group and reap it (idempotent): a crash."""
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)


def _slots(client: redis.Redis) -> list[tuple[int, int, int, list[int]]]:
    # Raw CLUSTER SLOTS rows: [start, end, [host, port, id], replica, ...].
    rows: list[Any] = client.execute_command("CLUSTER SLOTS")  # type: ignore[no-untyped-call]
    return sorted((int(row[0]), int(row[1]), int(row[2][1]), sorted(int(r[1]) for r in row[3:]))
                  for row in rows)


@dataclass
class LocalCluster:
    """The nodes of one local cluster, and what their CLUSTER commands say."""

    nodes: list[ClusterNode]
    #: Replicas each master should have (a failed-over master's replica is gone).
    replicas: int = 1

    @property
    def url(self) -> str:
        """``redis://`` URL of a live node: any one names the whole cluster."""
        return f"redis://127.0.0.1:{self.live()[0].port}/0"

    def live(self) -> list[ClusterNode]:
        """The nodes whose process runs."""
        return [n for n in self.nodes if n.alive()]

    def node(self, port: int) -> ClusterNode:
        """The node on ``port``."""
        return next(n for n in self.nodes if n.port == port)

    def slots(self) -> list[tuple[int, int, int, list[int]]]:
        """(first slot, last slot, master port, replica ports), as a live node sees them."""
        with self.live()[0].admin() as c:
            return _slots(c)

    def masters(self) -> list[int]:
        """Ports of the masters that serve slots."""
        return sorted({port for _s, _e, port, _r in self.slots()})

    def master_of_slot(self, slot: int) -> int:
        """Port of the master that serves ``slot``."""
        for start, end, port, _replicas in self.slots():
            if start <= slot <= end:
                return port
        raise AssertionError(f"no master serves slot {slot}")

    def master_of_key(self, key: str) -> int:
        """Port of the master that holds ``key``."""
        return self.master_of_slot(key_slot(key.encode()))

    def replicas_of(self, master: int) -> list[int]:
        """Ports of the replicas of ``master``."""
        return sorted({r for _s, _e, port, reps in self.slots() if port == master for r in reps})

    def healthy(self) -> bool:
        """Every live node says ``cluster_state:ok``, all agree on the slot map, and
        every replica's link to its master is up."""
        views = []
        for node in self.live():
            with contextlib.suppress(redis.RedisError), node.admin() as c:
                if c.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                    return False
                views.append(_slots(c))
                info = c.info("replication")
                if info.get("role") == "slave" and info.get("master_link_status") != "up":
                    return False
                continue
            return False
        if not views or any(v != views[0] for v in views):
            return False
        # Each master with as many replicas as there are live nodes for (a
        # killed master leaves its promoted replica alone).
        return all(len(reps) >= min(self.replicas, len(self.live()) // len(views[0]) - 1)
                   for _s, _e, _m, reps in views[0])

    def wait_healthy(self, timeout: float = 30) -> None:
        """Until :meth:`healthy`."""
        wait(self.healthy, timeout, "the cluster to be ok on every node, replicas in sync")

    def wait_promoted(self, old_master: int, timeout: float = 30) -> int:
        """Until a replica of ``old_master`` serves its slots and the cluster is ok; its port."""
        old_slots = [(s, e) for s, e, port, _r in self.slots() if port == old_master]

        def promoted() -> int | None:
            with contextlib.suppress(redis.RedisError, AssertionError, StopIteration):
                owners = {port for s, e, port, _r in self.slots() if (s, e) in old_slots}
                new = owners.pop() if len(owners) == 1 else old_master
                if new != old_master and self.healthy():
                    return new
            return None
        return wait(promoted, timeout, f"a replica of {old_master} to take over its slots")

    def spread_prefix(self, name: str, partitions: int, at_least: int = 2) -> str:
        """A fresh key prefix whose ``partitions`` partitions give every master at least
        ``at_least`` of them (a random prefix leaves one master out now and then)."""
        from celery_zsched.store.keys import Keys

        masters = self.masters()
        for _ in range(1000):
            prefix = "{" + name + uuid.uuid4().hex[:8] + "}:"
            owners = Counter(self.master_of_key(keys.defs)
                             for keys in Keys(prefix).partitions(partitions))
            if len(owners) == len(masters) and min(owners.values()) >= at_least:
                return prefix
        raise AssertionError(f"no prefix spreads {partitions} partitions over {masters}")

    def keys_on(self, port: int) -> int:
        """DBSIZE of the node on ``port``."""
        with self.node(port).admin() as c:
            return int(c.dbsize())

    def flushall(self, port: int) -> None:
        """FLUSHALL on the node on ``port`` (a master: its replicas follow)."""
        with self.node(port).admin() as c:
            c.flushall()

    def stop(self) -> None:
        """SIGKILL every node (idempotent)."""
        for node in self.nodes:
            node.kill()


def _create(cli: str, nodes: list[ClusterNode], replicas: int) -> None:
    result = subprocess.run(
        [cli, "--cluster", "create", *(n.address for n in nodes),
         "--cluster-replicas", str(replicas), "--cluster-yes"],
        capture_output=True, text=True, timeout=60)
    if result.returncode != 0 or "[OK] All 16384 slots covered" not in result.stdout:
        raise AssertionError(f"redis-cli --cluster create failed ({result.returncode}):\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-2000:]}")


def _answering(node: ClusterNode, server: str, tries: int = 3) -> None:
    """Wait for ``node`` to answer; one whose port was taken between the check that it
    was free and its bind (another test's server, on a busy machine) gets a new port."""
    for attempt in range(tries):
        try:
            wait(node.answers, 10, f"redis-server on port {node.port}")
            return
        except AssertionError as exc:
            if attempt == tries - 1 or "Address already in use" not in str(exc):
                raise
        node.kill()
        node.port = cluster_port()
        node.start(server)


@contextlib.contextmanager
def local_cluster(workdir: Path, masters: int = 3, replicas: int = 1) -> Iterator[LocalCluster]:
    """Start ``masters`` masters with ``replicas`` replicas each, as one healthy cluster.

    Skips (with the reason) when ``redis-server`` or ``redis-cli`` is missing.
    Every node started is SIGKILLed on exit, whatever happened.
    """
    server, cli = require_binaries()
    cluster = LocalCluster([ClusterNode(workdir / f"node{i}")
                            for i in range(masters * (1 + replicas))], replicas)
    try:
        for node in cluster.nodes:
            node.start(server)
        for node in cluster.nodes:
            _answering(node, server)
        _create(cli, cluster.nodes, replicas)
        cluster.wait_healthy(60)
        yield cluster
    finally:
        cluster.stop()
