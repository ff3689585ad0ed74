"""The recrawl fields (issue 22) through the management API: created, edited, refused
naming the field, and exported as the job resource."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.gateway.conftest import WRITER, Served

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
