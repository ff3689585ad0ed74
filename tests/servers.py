"""Throwaway Redis servers of special kinds: TLS, Sentinel groups, ACL users.

Each server runs on a free port of 127.0.0.1 under a directory of the test's
``tmp_path``, keeps nothing on disk, and is SIGKILLed by :meth:`RedisServer.stop`
(the context managers and fixtures always call it, also when a test fails).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.helpers import free_port, wait

REDIS_SERVER = shutil.which("redis-server") or "redis-server"


@dataclass
class RedisServer:
    """One ``redis-server`` (or Sentinel) process with extra command-line options."""

    workdir: Path
    args: Sequence[str] = ()
    port: int = field(default_factory=free_port)
    #: Keywords of :class:`redis.Redis` for the admin client (TLS options, say).
    client_kwargs: dict[str, Any] = field(default_factory=dict)
    #: The port is the TLS port (``--port 0 --tls-port P``).
    tls: bool = False
    #: A ``sentinel.conf`` to run with ``--sentinel`` instead of plain options.
    sentinel_conf: str | None = None
    popen: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        """Its log file."""
        return self.workdir / f"redis-{self.port}.log"

    def start(self) -> RedisServer:
        """Start it and wait until it answers PING."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.sentinel_conf is not None:
            conf = self.workdir / f"sentinel-{self.port}.conf"
            port = "port 0\n" if self.tls else f"port {self.port}\n"
            conf.write_text(f"{port}bind 127.0.0.1\ndir {self.workdir}\n"
                            f"logfile {self.log}\n{self.sentinel_conf}")
            argv = [REDIS_SERVER, str(conf), "--sentinel"]
        else:
            ports = ["--port", "0", "--tls-port", str(self.port)] if self.tls \
                else ["--port", str(self.port)]
            argv = [REDIS_SERVER, *ports, "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--dir", str(self.workdir),
                    "--logfile", str(self.log), *self.args]
        self.popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.STDOUT)
        try:
            wait(self._answers, 10, f"redis-server on port {self.port}")
        except BaseException:
            self.stop()
            raise
        return self

    def _answers(self) -> bool:
        assert self.popen is not None
        if self.popen.poll() is not None:
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise AssertionError(f"redis-server on {self.port} exited:\n{text[-3000:]}")
        with contextlib.suppress(redis.ConnectionError, redis.ResponseError), self.admin() as c:
            return bool(c.ping())
        return False

    def admin(self, **kwargs: Any) -> redis.Redis:
        """A fresh client as the default user (close it, or use it in ``with``)."""
        options = {"ssl": True} if self.tls else {}
        return redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1,
                           socket_timeout=5, decode_responses=True,
                           **{**options, **self.client_kwargs, **kwargs})

    def url(self, user: str | None = None, password: str | None = None, db: int = 0) -> str:
        """``redis://`` (``rediss://`` with TLS) URL of database ``db``."""
        auth = f"{user or ''}:{password}@" if password is not None else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}127.0.0.1:{self.port}/{db}"

    def alive(self) -> bool:
        """The process has not exited."""
        return self.popen is not None and self.popen.poll() is None

    def stop(self) -> None:
        """SIGKILL it and reap it (idempotent)."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)


@contextlib.contextmanager
def running(*servers: RedisServer) -> Iterator[tuple[RedisServer, ...]]:
    """Start ``servers`` in order; stop every one that started, whatever happens."""
    started: list[RedisServer] = []
    try:
        for server in servers:
            started.append(server)
            server.start()
        yield servers
    finally:
        for server in reversed(started):
            server.stop()


# ------------------------------------------------------------------------- TLS
@dataclass(frozen=True)
class Certs:
    """PEM files of a test CA, a server and a client certificate it signed, and a stranger CA."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: A CA that signed nothing here: verifying the server with it must fail.
    other_ca: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(directory: Path) -> Certs:
    """A self-signed CA, server (127.0.0.1/localhost) and client certificates, via ``openssl``."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "2",
                 "-subj", f"/CN=zsched test {ca}", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                 cwd=d)
    (d / "server.ext").write_text(
        "subjectAltName = IP:127.0.0.1, DNS:localhost\n"
        # clientAuth too: replicas and Sentinels present it to the master.
        "extendedKeyUsage = serverAuth, clientAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage = clientAuth\n")
    for who in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-sha256", "-subj",
                 f"/CN=zsched test {who}", "-keyout", f"{who}.key", "-out", f"{who}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-sha256", "-extfile", f"{who}.ext",
                 "-out", f"{who}.pem", cwd=d)
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem",
                 d / "client.key", d / "other-ca.pem")


def tls_server(workdir: Path, certs: Certs, auth_clients: bool = True,
               args: Sequence[str] = ()) -> RedisServer:
    """A TLS-only redis-server (not started) that trusts ``certs.ca`` for client certificates."""
    return RedisServer(
        workdir, tls=True,
        args=["--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key),
              "--tls-ca-cert-file", str(certs.ca),
              "--tls-auth-clients", "yes" if auth_clients else "no", *args],
        client_kwargs={"ssl_ca_certs": str(certs.ca), "ssl_certfile": str(certs.client_cert),
                       "ssl_keyfile": str(certs.client_key)})


# -------------------------------------------------------------------- Sentinel
@dataclass
class SentinelGroup:
    """A master, a replica of it, and a Sentinel monitoring them as ``name``."""

    master: RedisServer
    replica: RedisServer
    sentinel: RedisServer
    name: str

    @property
    def url(self) -> str:
        """kombu's ``sentinel://`` URL of the group (db 0)."""
        return f"sentinel://127.0.0.1:{self.sentinel.port}/0"

    def master_port(self) -> int:
        """The port of the master, as the Sentinel names it now."""
        with self.sentinel.admin() as s:
            _host, port = s.sentinel_get_master_addr_by_name(self.name)
        return int(port)

    def wait_ready(self, timeout: float = 30) -> None:
        """Until the replica is in sync and the Sentinel knows it (a failover can promote it)."""
        def ready() -> bool:
            with self.replica.admin() as r, self.sentinel.admin() as s:
                if r.info("replication").get("master_link_status") != "up":
                    return False
                replicas = s.sentinel_slaves(self.name)
                return any(int(x["port"]) == self.replica.port
                           and not x.get("is_sdown") and not x.get("is_odown")
                           for x in replicas)
        wait(ready, timeout, "the replica to sync and the Sentinel to see it")

    def wait_failover(self, old_port: int, timeout: float = 60) -> int:
        """Until the Sentinel names a new master that accepts writes; its port."""
        def promoted() -> int | None:
            with contextlib.suppress(redis.RedisError):
                port = self.master_port()
                if port != old_port:
                    server = self.replica if port == self.replica.port else self.master
                    with server.admin() as c:
                        if c.info("replication").get("role") == "master":
                            return port
            return None
        try:
            port: int = wait(promoted, timeout, "the Sentinel to promote the replica")
        except AssertionError as exc:
            # The Sentinel's log says why (no good replica, an aborted election...).
            log = self.sentinel.log
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
            raise AssertionError(f"{exc}\nSentinel log:\n{tail}") from None
        return port


@contextlib.contextmanager
def sentinel_group(workdir: Path, name: str = "zsched-test", down_after_ms: int = 1000,
                   failover_timeout_ms: int = 5000,
                   certs: Certs | None = None) -> Iterator[SentinelGroup]:
    """Start a master, its replica and one Sentinel (quorum 1); stop all three afterwards.

    With ``certs`` every one of them listens on TLS only, replication and the
    Sentinel's own connections included, and asks clients for a certificate.
    """
    def node(where: str, args: Sequence[str] = ()) -> RedisServer:
        if certs is None:
            return RedisServer(workdir / where, args=list(args))
        return tls_server(workdir / where, certs, args=["--tls-replication", "yes", *args])

    master = node("master")
    replica = node("replica", ["--replicaof", "127.0.0.1", str(master.port)])
    conf = (f"sentinel monitor {name} 127.0.0.1 {master.port} 1\n"
            f"sentinel down-after-milliseconds {name} {down_after_ms}\n"
            f"sentinel failover-timeout {name} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {name} 1\n")
    sentinel = RedisServer(workdir / "sentinel", sentinel_conf=conf)
    if certs is not None:
        sentinel = tls_server(workdir / "sentinel", certs)
        sentinel.sentinel_conf = conf + (
            f"tls-port {sentinel.port}\ntls-replication yes\n"
            f"tls-cert-file {certs.server_cert}\ntls-key-file {certs.server_key}\n"
            f"tls-ca-cert-file {certs.ca}\n"
            # Sentinels use these to reach the master and the replica.
            f"tls-client-cert-file {certs.client_cert}\n"
            f"tls-client-key-file {certs.client_key}\n")
    with running(master, replica, sentinel):
        group = SentinelGroup(master, replica, sentinel, name)
        group.wait_ready()
        yield group
