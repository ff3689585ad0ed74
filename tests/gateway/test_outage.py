"""Redis goes away under a running gateway: it stays up, answers 503 with Retry-After,
retries with backoff, and serves again once Redis is back."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import RedisProcess
from tests.gateway.conftest import Served, http_job
from tests.helpers import free_port, wait


@pytest.fixture
def spare(redis_server: Any, tmp_path: Path) -> Iterator[RedisProcess]:
    """A redis-server of this test's own, which it may kill and restart."""
    server = RedisProcess(str(redis_server.executable), free_port(), tmp_path)
    server.start()
    yield server
    server.kill()


def test_the_gateway_answers_503_while_redis_is_down_and_recovers(
        serve: Callable[..., Served], spare: RedisProcess) -> None:
    served = serve(redis_url=spare.url, gateway_timeout_s=1.0)
    served.store.upsert(http_job("before"))
    with served.client() as client:
        job = client.get("/jobs/next").json()
        spare.kill()
        polled = client.get("/jobs/next")
        assert polled.status_code == 503 and int(polled.headers["Retry-After"]) >= 1
        reported = client.post("/jobs/before/complete", json={"lease": job["lease"]})
        assert reported.status_code == 503 and reported.headers["Retry-After"]
        assert served.server.started and served.thread.is_alive()
        spare.start()  # empty again: no persistence
        served.store.upsert(http_job("after"))

        def serves() -> int | None:
            res = client.get("/jobs/next", params={"timeout": 0.5})
            return res.status_code if res.status_code == 200 else None

        started = time.monotonic()
        wait(serves, 15, "the gateway to serve again", interval=0.2)
        assert time.monotonic() - started < 12
