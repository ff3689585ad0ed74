"""Beat and a worker keep the schedule on a TLS-only redis-server with client certificates."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from e2e.conftest import Deployment, TargetServer
from tests.servers import Certs, RedisServer, make_certs, running, tls_server


@pytest.fixture
def tls_store(tmp_path: Path) -> Iterator[tuple[RedisServer, Certs]]:
    """Requested before ``deploy``, so it outlives the processes."""
    certs = make_certs(tmp_path / "certs")
    with running(tls_server(tmp_path / "tls-redis", certs)) as (server,):
        yield server, certs


@pytest.mark.slow
def test_beat_and_worker_over_tls_with_client_certificates(
        tls_store: tuple[RedisServer, Certs], deploy: Callable[..., Deployment],
        target: TargetServer) -> None:
    server, certs = tls_store
    d = deploy(store_url=server.url(), redis_ssl_ca_certs=str(certs.ca),
               redis_ssl_certfile=str(certs.client_cert),
               redis_ssl_keyfile=str(certs.client_key), redis_ssl_cert_reqs="required")
    paths = ["/ok/tls-a", "/ok/tls-b"]
    jobs = [d.job(url=target.url(p), interval_s=1) for p in paths]
    d.store.upsert_many(jobs, stagger=False)
    beat = d.start_beat()
    d.start_worker()
    for job in jobs:
        d.wait_info(job.id, lambda i: i.state.runs >= 2, 40, "two settled runs over TLS")
    assert beat.alive()
    assert "unavailable" not in beat.text()
    # The store really is on the TLS server (its only port is the TLS port).
    with server.admin() as admin:
        assert all(admin.hexists(d.store.keys.defs, job.id) for job in jobs)
