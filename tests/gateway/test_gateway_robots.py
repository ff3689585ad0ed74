"""The job gateway with ``zsched_robots``: a disallowed job is never handed out.

Real server (uvicorn in a thread), real Redis, and a local site serving the
robots.txt, on a loopback address of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from celery_zsched.core.job import Job
from celery_zsched.core.state import RuntimeState
from tests.gateway.conftest import Served
from tests.robots_site import Site, serve_sites


@pytest.fixture
def sites() -> Iterator[Callable[..., Site]]:
    yield from serve_sites()


def _job(job_id: str, url: str) -> Job:
    return Job.from_dict({"id": job_id, "url": url, "transport": "http", "jitter_s": 0,
                          "interval_s": 60})


def test_the_gateway_settles_a_disallowed_job_and_hands_out_the_allowed_one(
        serve: Callable[..., Served], sites: Callable[..., Site]) -> None:
    site = sites({"/robots.txt": (200, {}, b"User-agent: *\nDisallow: /private/\n")})
    served = serve(robots=True)
    served.store.upsert(_job("private", site.url("/private/x")))
    with served.client() as client:
        assert client.get("/jobs/next", params={"timeout": 0}).status_code == 204
        served.store.upsert(_job("public", site.url("/public")))
        offered = client.get("/jobs/next", params={"timeout": 0})
    assert offered.status_code == 200 and offered.json()["id"] == "public"
    state = RuntimeState.from_wire(served.store.client.hget(served.store.keys.state, "private"))
    assert state.last_outcome == "blocked_by_robots" and state.status == "scheduled"
    due = served.store.client.zscore(served.store.keys.http_schedule, "private")
    assert due is not None and due - served.store.now_ms() > 86_400_000 - 60_000
    assert site.count("/robots.txt") == 1  # one fetch served both checks


def test_with_robots_off_the_gateway_checks_nothing(
        serve: Callable[..., Served], sites: Callable[..., Site]) -> None:
    site = sites({"/robots.txt": (200, {}, b"User-agent: *\nDisallow: /\n")})
    served = serve()
    served.store.upsert(_job("any", site.url("/x")))
    with served.client() as client:
        assert client.get("/jobs/next", params={"timeout": 0}).json()["id"] == "any"
    assert site.count("/robots.txt") == 0
