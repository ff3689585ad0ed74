"""The recrawl fields (issue 22) through the management API: created, edited, refused
naming the field, and exported as the job resource."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from celery_zsched.core import recrawl
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


def test_a_gateway_report_whose_last_modified_dates_its_change_feeds_the_dated_estimate(
        serve: Callable[..., Served]) -> None:
    served = serve()
    served.store.upsert(http_job("page", recrawl="adaptive", interval_s=600))
    with served.client() as client:
        first = _take(served)
        res = client.post("/jobs/page/complete", json={"lease": first["lease"],
                                                       "changed": False})
        assert res.status_code == 200, res.text
        served.store.run_now("page")
        second = _take(served)
        # The page dates its change 30 s before now (Redis' clock): inside the gap
        # since the first visit once that visit is moved an hour back.
        raw = json.loads(served.store.client.hget(served.store.keys.state, "page"))
        now_s = served.store.now_ms() / 1000
        raw["hl"] = round((now_s - 3600) * 1000)
        served.store.client.hset(served.store.keys.state, "page", json.dumps(raw))
        dated = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now_s - 30))
        res = client.post("/jobs/page/complete", json={
            "lease": second["lease"], "changed": True, "last_modified": dated})
        assert res.status_code == 200, res.text
    state = served.store.states(["page"])[0]
    assert state is not None and state.visits == 1 and state.changes == 1
    # Watched unchanged from the dated change (30-31 s: the date is to the second),
    # not the hour's gap; no undated change, so the rate is X / W.
    assert state.covered_s == pytest.approx(3600, abs=5)
    assert 29 <= (state.watched_s or 0) <= 36 and state.undated == 0
    rate = recrawl.history_of(state).rate()
    assert rate == pytest.approx(1 / (state.watched_s or 1))
    with served.client(WRITER) as client:
        shown = client.get("/v1/jobs/page").json()["recrawl"]
    assert shown["estimator"] == "dated"
    assert shown["change_rate_per_day"] == pytest.approx(rate * 86_400, rel=1e-3)
