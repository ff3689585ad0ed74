"""The job gateway runs as the documented minimal ACL user (docs/how-to/connections.md):
Redis refuses none of its commands (its claims, reports, reaps, wake-ups and their subscription)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.test_acl import PLACEHOLDER, assert_confined, readme_rule, refusals
from tests.gateway.conftest import WRITER, Served, http_job
from tests.servers import RedisServer, running


@pytest.fixture
def acl_url(tmp_path: Path) -> Iterator[tuple[RedisServer, str]]:
    password = secrets.token_hex(8)
    rule = [">" + password if w == ">" + PLACEHOLDER else w for w in readme_rule()]
    with running(RedisServer(tmp_path / "acl-redis")) as (server,):
        with server.admin() as admin:
            assert admin.execute_command(*rule) == "OK"
            admin.execute_command("ACL", "LOG", "RESET")
        yield server, server.url(user=rule[2], password=password)


def test_the_gateway_needs_no_more_than_the_readme_acl_rule(
        serve: Callable[..., Served], acl_url: tuple[RedisServer, str]) -> None:
    server, url = acl_url
    served = serve(redis_url=url, key_prefix="{zsched}:", gateway_timeout_s=3)
    served.store.upsert(http_job("acl", run_at=served.store.now_ms() / 1000 + 0.3))
    with served.client() as client:
        job = client.get("/jobs/next").json()  # woken through the wake-up channel
        res = client.post("/jobs/acl/error", json={"lease": job["lease"], "error": "e"})
        assert res.status_code == 200
        retry = client.get("/jobs/next", params={"timeout": 0.2})
        assert retry.status_code == 204
        served.store.run_now("acl")
    assert refusals(server) == []
    assert_confined(server, url)  # and the same user can reach nothing else


def test_the_rest_api_needs_no_more_than_the_readme_acl_rule(
        serve: Callable[..., Served], acl_url: tuple[RedisServer, str]) -> None:
    server, url = acl_url
    served = serve(redis_url=url, key_prefix="{zsched}:")
    with served.client(WRITER) as client:
        created = client.post("/v1/jobs", json={"url": "https://a.example/", "queue": "eu"},
                              headers={"Idempotency-Key": "acl"})
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        replay = client.post("/v1/jobs", json={"url": "https://a.example/", "queue": "eu"},
                             headers={"Idempotency-Key": "acl"})
        assert replay.headers["idempotent-replayed"] == "true"
        for status in ("scheduled", "paused", "dead", None):
            listed = client.get("/v1/jobs", params={"status": status, "queue": "eu"}
                                if status else {"domain": "a.example"})
            assert listed.status_code == 200, listed.text
        assert client.get(f"/v1/jobs/{job_id}", params={"fires": 3}).status_code == 200
        assert client.patch(f"/v1/jobs/{job_id}", json={"name": "n"}).status_code == 200
        assert client.patch(f"/v1/jobs/{job_id}", json={"status": "paused"}).status_code == 200
        assert client.post(f"/v1/jobs/{job_id}:run").status_code == 202
        assert client.get(f"/v1/jobs/{job_id}/executions").status_code == 200
        imported = client.post("/v1/jobs:import", content=b'{"url": "https://b.example/"}\n',
                               headers={"Content-Type": "application/x-ndjson"})
        assert imported.status_code == 200, imported.text
        assert client.delete(f"/v1/jobs/{job_id}").status_code == 204
    assert refusals(server) == []
