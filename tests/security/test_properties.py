"""Property-based runs over what a client controls in a URL: the executions cursor, job
ids in paths, and query strings. Whatever they hold, the answer is a documented 4xx or
a 2xx in problem+json or JSON, never a 5xx (a real server on the throwaway Redis)."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.conftest import READER, WORKER, WRITER, Served, http_job

PROPERTY = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
#: Text a client may put in a URL: anything, with the characters paths treat specially.
URL_TEXT = st.text(st.one_of(st.characters(codec="utf-8"), st.sampled_from("./%-:@?#&=+\\")),
                   max_size=60)


@pytest.fixture
def served(serve: Callable[..., Served]) -> Served:
    server = serve()
    server.store.upsert(http_job("known", queue="eu"))
    return server


def _sound(answer: httpx.Response) -> None:
    assert answer.status_code < 500, (answer.request.url, answer.text[:300])
    if answer.status_code >= 400:
        assert answer.headers["content-type"] == "application/problem+json", answer.text
        assert answer.json()["status"] == answer.status_code


@PROPERTY
@given(before=st.one_of(URL_TEXT, st.from_regex(r"\A-?\d{1,25}-\d{1,25}\Z")))
def test_any_executions_cursor_is_answered_without_a_5xx(served: Served, before: str) -> None:
    with served.client(READER) as client:
        answer = client.get("/v1/jobs/known/executions", params={"before": before})
    _sound(answer)
    if answer.status_code == 400:
        assert answer.json()["field"] == "before"


@PROPERTY
@given(job_id=URL_TEXT, encode=st.booleans(),
       route=st.sampled_from(["GET /v1/jobs/{}", "GET /v1/jobs/{}/executions",
                              "DELETE /v1/jobs/{}", "POST /v1/jobs/{}:run",
                              "PATCH /v1/jobs/{}", "POST /jobs/{}/heartbeat"]))
def test_any_id_in_any_path_is_answered_without_a_5xx(served: Served, job_id: str,
                                                      encode: bool, route: str) -> None:
    method, path = route.split(" ")
    token = WORKER if path.startswith("/jobs/") else WRITER
    segment = quote(job_id, safe="") if encode else quote(job_id, safe="/:@.")
    with served.client(token) as client:
        body = {"lease": "1.1.x"} if path.startswith("/jobs/") else {"name": "n"}
        answer = client.request(method, path.format(segment),
                                json=body if method in ("POST", "PATCH") else None)
    _sound(answer)


@PROPERTY
@given(query=st.lists(st.tuples(st.sampled_from(["limit", "cursor", "status", "kind", "queue",
                                                 "domain", "transport", "fires", "before",
                                                 "timeout", "format", "dry_run", "x"]),
                                URL_TEXT), max_size=4),
       path=st.sampled_from(["/v1/jobs", "/v1/jobs/known", "/v1/jobs/known/executions",
                             "/jobs/next"]))
def test_any_query_string_is_answered_without_a_5xx(served: Served,
                                                    query: list[tuple[str, str]],
                                                    path: str) -> None:
    token = WORKER if path == "/jobs/next" else READER
    params = [(k, v) for k, v in query if not (path == "/jobs/next" and k == "timeout")]
    if path == "/jobs/next":
        params.append(("timeout", "0"))  # no long-poll: an answer now
    with served.client(token) as client:
        _sound(client.get(path, params=params))
