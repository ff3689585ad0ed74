"""Bugs Schemathesis found (tests/gateway/test_openapi_schemathesis.py), each pinned by a
plain test against a real server and Redis."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx

from celery_zsched.config import Settings
from celery_zsched.server.problems import PROBLEM_JSON
from celery_zsched.store import Store
from tests.gateway.conftest import (
    WORKER,
    WRITER,
    Served,
    http_job,
    serve_process,
    stop_process,
)
from tests.helpers import free_port


def test_a_job_whose_id_has_slashes_can_be_reported_and_its_lease_extended(
        serve: Callable[..., Served]) -> None:
    # Ids may hold "/" (the gateway's routes once matched one path segment: 404).
    served = serve()
    served.store.upsert(http_job("team/a/b"))
    with served.client() as client:
        job = client.get("/jobs/next", params={"timeout": 0}).json()
        assert job["id"] == "team/a/b"
        beat = client.post("/jobs/team%2Fa%2Fb/heartbeat", json={"lease": job["lease"]})
        done = client.post("/jobs/team%2Fa%2Fb/complete", json={"lease": job["lease"]})
    assert beat.status_code == 200, beat.text
    assert done.status_code == 200 and done.json()["applied"] is True, done.text
    state = served.store.states(["team/a/b"])[0]
    assert state is not None and state.runs == 1


def test_a_path_no_route_matches_answers_problem_json(serve: Callable[..., Served]) -> None:
    # A control character in an id matched no route: Starlette's plain JSON 404.
    served = serve()
    with served.client(WRITER) as client:
        missing = client.delete("/v1/jobs/a%0Ab/executions")
        wrong_method = client.put("/v1/jobs")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == PROBLEM_JSON
    assert missing.json()["status"] == 404
    assert wrong_method.status_code == 405
    assert wrong_method.headers["content-type"] == PROBLEM_JSON
    assert wrong_method.headers["allow"] == "GET, POST"


def test_a_serve_process_logging_past_a_pipe_buffer_keeps_answering(
        redis_url: str) -> None:
    # The soak run hung its server: warnings filled the unread stdout pipe (64 KiB).
    prefix = f"pipe{uuid.uuid4().hex[:8]}"
    port = free_port()
    proc = serve_process(redis_url, prefix, port)
    try:
        Store.from_settings(Settings(redis_url=redis_url, key_prefix=prefix,
                                     max_jitter_s=0)).upsert(http_job("noisy"))
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5,
                          headers={"Authorization": f"Bearer {WORKER}"}) as client:
            lease = client.get("/jobs/next", params={"timeout": 0}).json()["lease"]
            # Each report logs a job_error warning of over 2 KB: 100 of them, 200 KB.
            for _ in range(100):
                answer = client.post("/jobs/noisy/error",
                                     json={"lease": lease, "error": "x" * 2000})
                assert answer.status_code in (200, 409)
    finally:
        output = stop_process(proc)
    assert output.count("job_error") == 100
