"""Batched hand-outs and reports (issue 23): ``GET /jobs/next?max=N`` and ``POST /jobs/report``.

A poll with ``max`` takes up to N due jobs from one claim, each under a lease of
its own; a poll without it keeps the first shape (the job itself). A batch report
settles each report as its single route would, and answers each with that route's
status as ``code``: one bad or stale report changes nothing and stops nothing.
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from celery_zsched.core.results import SettleReport
from celery_zsched.core.state import RuntimeState
from celery_zsched.server.bodies import MAX_BATCH
from celery_zsched.server.gateway_batch import MAX_BATCH_BODY
from celery_zsched.store import Store
from tests.gateway.conftest import READER, WORKER, Served, http_job
from tests.helpers import store_snapshot

ECHO = ("lease", "scheduled_at", "picked_up_at")


def _state(store: Store, job_id: str) -> RuntimeState:
    state = store.states([job_id])[0]
    assert state is not None
    return state


def _due(served: Served, *ids: str) -> None:
    for job_id in ids:
        served.store.upsert(http_job(job_id))


def _take(client: httpx.Client, most: int, **params: Any) -> list[dict[str, Any]]:
    res = client.get("/jobs/next", params={"max": most, **params})
    assert res.status_code == 200, res.text
    jobs: list[dict[str, Any]] = res.json()["jobs"]
    return jobs


def _report(job: dict[str, Any], outcome: str = "complete", **fields: Any) -> dict[str, Any]:
    return {"id": job["id"], "outcome": outcome, **{k: job[k] for k in ECHO}, **fields}


# ------------------------------------------------------------------ hand-out
def test_a_poll_with_max_takes_up_to_n_jobs_from_one_claim_each_under_its_own_lease(
        serve: Callable[..., Served]) -> None:
    served = serve()
    _due(served, *(f"b{n}" for n in range(5)))
    with served.client() as client:
        jobs = _take(client, 3, timeout=0)
        rest = _take(client, 3, timeout=0)
    assert len(jobs) == 3 and len(rest) == 2
    ids = [job["id"] for job in jobs + rest]
    assert sorted(ids) == [f"b{n}" for n in range(5)]  # each handed out once
    assert len({job["lease"] for job in jobs + rest}) == 5
    # One claim: one reading of Redis' clock for the whole batch.
    assert len({job["picked_up_at"] for job in jobs}) == 1
    for job in jobs + rest:
        state = _state(served.store, job["id"])
        assert state.status == "running"
        assert job["lease"].split(".")[2] == str(state.fence)  # its own hand-out's fence
        assert job["deliveries"] == 1


def test_a_poll_without_max_keeps_the_single_job_shape(serve: Callable[..., Served]) -> None:
    served = serve()
    _due(served, "plain")
    with served.client() as client:
        res = client.get("/jobs/next", params={"timeout": 0})
    assert res.status_code == 200
    assert res.json()["id"] == "plain" and "jobs" not in res.json()


def test_a_batch_poll_answers_with_what_is_due_without_waiting_to_fill(
        serve: Callable[..., Served]) -> None:
    served = serve(gateway_timeout_s=30)
    _due(served, "only")
    with served.client(timeout=60) as client:
        jobs = _take(client, 50)  # the long-poll default: 30 s
    assert [job["id"] for job in jobs] == ["only"]


def test_a_waiting_batch_poll_is_woken_by_a_job_falling_due(
        serve: Callable[..., Served]) -> None:
    served = serve(gateway_timeout_s=10)
    with concurrent.futures.ThreadPoolExecutor(1) as pool, served.client(timeout=30) as client:
        future = pool.submit(client.get, "/jobs/next", params={"max": 10})
        due = served.store.now_ms() + 300
        served.store.upsert(http_job("later", run_at=due / 1000))
        res = future.result(30)
    assert res.status_code == 200, res.text
    assert [job["id"] for job in res.json()["jobs"]] == ["later"]
    assert res.json()["jobs"][0]["picked_up_at"] >= due


def test_nothing_due_answers_a_batch_poll_204(serve: Callable[..., Served]) -> None:
    served = serve(gateway_timeout_s=0.2)
    with served.client() as client:
        assert client.get("/jobs/next", params={"max": 5}).status_code == 204
        assert client.get("/jobs/next", params={"max": 5, "timeout": 0}).status_code == 204


@pytest.mark.parametrize("value", ["0", str(MAX_BATCH + 1), "-1", "many", "1.5"])
def test_a_bad_max_is_refused_400_naming_it(serve: Callable[..., Served], value: str) -> None:
    served = serve()
    _due(served, "kept")
    before = store_snapshot(served.store)
    with served.client() as client:
        res = client.get("/jobs/next", params={"max": value, "timeout": 0})
    assert res.status_code == 400 and res.json()["field"] == "max", res.text
    assert store_snapshot(served.store) == before


# ------------------------------------------------------------------- reports
def test_a_batch_report_settles_each_report_with_the_answer_its_route_would_give(
        serve: Callable[..., Served]) -> None:
    served = serve()
    _due(served, "done", "failed", "kept", "other")
    with served.client() as client:
        jobs = {job["id"]: job for job in _take(client, 4, timeout=0)}
        done, failed, kept, other = (jobs[i] for i in ("done", "failed", "kept", "other"))
        reports: list[Any] = [
            _report(done),
            _report(failed, "error", error="HTTP 503", status=503),
            _report(done),  # the same report again: stale
            {**_report(kept), "lease": other["lease"]},  # another job's lease
            {**_report(other), "outcome": "skip"},
            {**_report(other), "error": "complete takes no error"},
            {"outcome": "complete", "lease": other["lease"]},
            "not an object",
        ]
        res = client.post("/jobs/report", json={"reports": reports})
        assert res.status_code == 200, res.text
        results = res.json()["results"]
        # The single route's answer to the repeated report, for comparison.
        alone = client.post("/jobs/done/complete", json={k: done[k] for k in ECHO})
    assert [r["code"] for r in results] == [200, 200, 409, 400, 400, 400, 400, 400]
    assert [r["id"] for r in results] == ["done", "failed", "done", "kept", "other", "other",
                                          None, None]
    assert results[0]["applied"] and results[0]["outcome"] == "complete"
    assert results[1]["applied"] and results[1]["outcome"] == "retrying"
    assert alone.status_code == 409
    assert {k: v for k, v in results[2].items() if k not in ("id", "code")} == alone.json()
    assert [r["field"] for r in results[3:]] == [
        "reports.3.lease", "reports.4.outcome", "reports.5.error", "reports.6.id",
        "reports.7"]
    assert _state(served.store, "done").status == "scheduled"
    failed_state = _state(served.store, "failed")
    assert (failed_state.status, failed_state.attempt) == ("scheduled", 2)  # its retry
    # The refused reports changed nothing: their jobs still run under their leases.
    assert _state(served.store, "kept").status == "running"
    assert _state(served.store, "other").status == "running"


def test_a_batch_report_applies_each_lease_once_however_often_it_is_sent(
        serve: Callable[..., Served]) -> None:
    served = serve(partitions=3)
    ids = [f"p{n}" for n in range(12)]
    _due(served, *ids)
    with served.client() as client:
        jobs = _take(client, 12, timeout=0)
        body = {"reports": [_report(job) for job in jobs]}
        first = client.post("/jobs/report", json=body).json()["results"]
        again = client.post("/jobs/report", json=body).json()["results"]
    assert sorted(job["id"] for job in jobs) == sorted(ids)  # from every partition
    assert [r["code"] for r in first] == [200] * 12
    assert [r["code"] for r in again] == [409] * 12
    events = [fields for part in served.store.parts
              for _, fields in served.store.client.xrange(part.events)
              if fields.get("id") in ids]
    assert sorted(e["id"] for e in events) == sorted(ids)  # each settled once


def test_a_lease_handed_out_again_is_fenced_in_a_batch_too(
        serve: Callable[..., Served]) -> None:
    served = serve()
    store = served.store
    _due(served, "fenced")
    with served.client() as client:
        (old,) = _take(client, 1, timeout=0)
        store.client.zadd(store.keys.leases, {"fenced": 0})  # its lease ran out
        store.reap()
        (new,) = _take(client, 1, timeout=0)
        assert new["lease"] != old["lease"]
        stale = client.post("/jobs/report", json={"reports": [_report(old)]})
        fresh = client.post("/jobs/report", json={"reports": [_report(new)]})
    assert stale.json()["results"][0]["code"] == 409
    assert fresh.json()["results"][0]["code"] == 200


@pytest.mark.parametrize(("body", "field"), [
    (b"[]", "body"),
    (b"{not json", "body"),
    (b"{}", "reports"),
    (b'{"reports": []}', "reports"),
    (b'{"reports": {}}', "reports"),
    (json.dumps({"reports": [{}] * (MAX_BATCH + 1)}).encode(), "reports"),
    (b'{"reports": [{}], "extra": 1}', "extra"),
], ids=["array", "not-json", "no-reports", "empty", "not-a-list", "too-many", "extra"])
def test_a_malformed_batch_is_refused_400_naming_the_field_and_changes_nothing(
        serve: Callable[..., Served], body: bytes, field: str) -> None:
    served = serve()
    _due(served, "untouched")
    with served.client() as client:
        (job,) = _take(client, 1, timeout=0)
        before = store_snapshot(served.store)
        # A valid report rides along: the whole batch is refused, it too.
        res = client.post("/jobs/report", content=body.replace(b"[{}]", json.dumps(
            [_report(job)]).encode()), headers={"Content-Type": "application/json"})
    assert res.status_code == 400, res.text
    assert res.json()["field"] == field
    assert store_snapshot(served.store) == before


def test_a_batch_body_over_its_limit_is_refused_413(serve: Callable[..., Served]) -> None:
    served = serve()
    with served.client() as client:
        res = client.post("/jobs/report", content=b"{" + b" " * MAX_BATCH_BODY + b"}",
                          headers={"Content-Type": "application/json"})
    assert res.status_code == 413


# ---------------------------------------------------------------------- auth
ROUTES = [("GET", "/jobs/next?max=5&timeout=0", b""),
          ("GET", "/jobs/next?timeout=0", b""),
          ("POST", "/jobs/report", b'{"reports": [{"id": "x", "outcome": "complete", '
                                   b'"lease": "1.1.1.AAAAAAAAAAAAAAAAAAAAAA"}]}'),
          ("POST", "/jobs/x/complete", b'{"lease": "1.1.1.AAAAAAAAAAAAAAAAAAAAAA"}'),
          ("POST", "/jobs/x/error", b'{"lease": "1.1.1.AAAAAAAAAAAAAAAAAAAAAA", "error": "e"}'),
          ("POST", "/jobs/x/heartbeat", b'{"lease": "1.1.1.AAAAAAAAAAAAAAAAAAAAAA"}')]


def test_the_matrix_covers_every_gateway_route(serve: Callable[..., Served]) -> None:
    served = serve()
    with served.client(READER) as client:
        paths = client.get("/openapi.json").json()["paths"]
    documented = {(m.upper(), p) for p, ops in paths.items() if p.startswith("/jobs")
                  for m in ops}
    listed = {(m, p.split("?")[0].replace("/x/", "/{job_id}/")) for m, p, _ in ROUTES}
    assert documented == listed


@pytest.mark.parametrize(("token", "status"), [
    (None, 401), ("not-a-token-at-all-xxxx", 401), (READER, 403)])
def test_every_gateway_route_refuses_a_token_without_the_worker_scope_and_changes_nothing(
        serve: Callable[..., Served], token: str | None, status: int) -> None:
    served = serve()
    _due(served, "x")
    before = store_snapshot(served.store)
    with served.client(token) as client:
        for method, path, body in ROUTES:
            res = client.request(method, path, content=body or None,
                                 headers={"Content-Type": "application/json"})
            assert res.status_code == status, (method, path, res.text)
    assert store_snapshot(served.store) == before
    with served.client(WORKER) as client:  # and the worker token may
        assert client.get("/jobs/next", params={"max": 5, "timeout": 0}).status_code == 200


# --------------------------------------------------------------------- store
def test_settle_many_answers_as_settle_would_one_by_one(make_store: Callable[..., Store]
                                                         ) -> None:
    store = make_store(partitions=3, max_jitter_s=0.0)
    ids = [f"s{n}" for n in range(9)]
    for job_id in ids:
        store.upsert(http_job(job_id))
    claimed = {c.job.id: c for c in store.claim_http(9).jobs}
    reports = [SettleReport(job_id, claimed[job_id].occurrence, claimed[job_id].attempt,
                            "error" if n % 3 == 0 else "complete", error="boom",
                            fence=claimed[job_id].fence)
               for n, job_id in enumerate(ids)]
    stale = SettleReport("s1", claimed["s1"].occurrence, claimed["s1"].attempt, "complete",
                         fence=claimed["s1"].fence)
    results = store.settle_many([*reports, stale])
    assert [r.applied for r in results] == [True] * 9 + [False]
    assert [r.label for r in results[:9]] == [
        "retrying" if n % 3 == 0 else "complete" for n in range(9)]
    assert results[9].status == "stale"
    states = store.states(ids)
    assert [(s.status, s.attempt) if s else None for s in states] == [
        ("scheduled", 2 if n % 3 == 0 else 1) for n in range(9)]
    with pytest.raises(ValueError, match="unknown outcome"):
        store.settle_many([SettleReport("s1", 1, 1, "done")])
