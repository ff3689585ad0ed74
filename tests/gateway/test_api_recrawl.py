"""The recrawl fields (issue 22) through the management API: created, edited, refused
naming the field, and exported as the job resource."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.gateway.conftest import WRITER, Served, http_job

URL = "https://example.org/feed"
ADAPTIVE = {"url": URL, "interval_s": 600, "recrawl": "adaptive", "min_interval_s": 60,
            "max_interval_s": 6000, "freshness_target": 0.9}


@pytest.fixture
def api(serve: Callable[..., Served]) -> Served:
    return serve()


def test_an_adaptive_job_is_created_read_and_edited(api: Served) -> None:
    with api.client(WRITER) as client:
        res = client.post("/v1/jobs", json=ADAPTIVE)
        assert res.status_code == 201, res.text
        job_id = res.json()["id"]
        body = client.get(f"/v1/jobs/{job_id}").json()
        assert {k: body["definition"][k] for k in ADAPTIVE if k != "url"} == {
            k: v for k, v in ADAPTIVE.items() if k != "url"}
        res = client.patch(f"/v1/jobs/{job_id}", json={"recrawl": "fixed"})
        assert res.status_code == 200, res.text
    assert api.store.get(job_id).job.recrawl == "fixed"


@pytest.mark.parametrize(("body", "field"), [
    ({"url": URL, "cron": "* * * * *", "recrawl": "adaptive"}, "recrawl"),
    ({**ADAPTIVE, "max_interval_s": 6}, "max_interval_s"),
    ({**ADAPTIVE, "freshness_target": 1.5}, "freshness_target"),
])
def test_a_bad_recrawl_field_is_400_naming_it_and_writes_nothing(
        api: Served, body: dict[str, object], field: str) -> None:
    with api.client(WRITER) as client:
        res = client.post("/v1/jobs", json=body)
    assert res.status_code == 400, res.text
    assert res.json()["field"] == field
    assert api.store.client.hlen(api.store.keys.defs) == 0


# ------------------------------------------------------------ the job gateway
def _take(served: Served) -> dict[str, object]:
    with served.client() as client:
        res = client.get("/jobs/next")
    assert res.status_code == 200, res.text
    body: dict[str, object] = res.json()
    return body


def test_the_gateway_hands_out_the_validators_and_a_304_report_is_a_visit_without_change(
        serve: Callable[..., Served]) -> None:
    served = serve()
    served.store.upsert(http_job("page", recrawl="adaptive", interval_s=600))
    first = _take(served)
    assert first["etag"] is None and first["last_modified"] is None
    with served.client() as client:
        res = client.post("/jobs/page/complete", json={
            "lease": first["lease"], "changed": True, "etag": '"v1"',
            "last_modified": "Wed, 21 Oct 2015 07:28:00 GMT"})
        assert res.status_code == 200, res.text
    served.store.run_now("page")
    second = _take(served)
    assert (second["etag"], second["last_modified"]) == (
        '"v1"', "Wed, 21 Oct 2015 07:28:00 GMT")
    with served.client() as client:
        res = client.post("/jobs/page/complete", json={"lease": second["lease"], "status": 304})
        assert res.status_code == 200, res.text
    assert res.json()["outcome"] == "complete"
    state = served.store.states(["page"])[0]
    assert state is not None and state.visits == 1 and state.changes == 0
    assert state.consecutive_failures == 0 and state.etag == '"v1"'


def test_a_report_with_a_header_injecting_etag_is_400_and_changes_nothing(
        serve: Callable[..., Served]) -> None:
    served = serve()
    served.store.upsert(http_job("page"))
    offer = _take(served)
    with served.client() as client:
        res = client.post("/jobs/page/complete", json={
            "lease": offer["lease"], "etag": '"v1"\r\nSet-Cookie: a=b'})
    assert res.status_code == 400, res.text
    state = served.store.states(["page"])[0]
    assert state is not None and state.status == "running" and state.etag is None
