"""The management API against a real server and Redis: create, read, edit, delete, run,
executions and import; Idempotency-Key and If-Match; bad input changes nothing."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from celery_zsched.core.job import Job
from celery_zsched.server import imports
from celery_zsched.store import audit_log
from tests.gateway.conftest import WORKER, WRITER, Served, http_job

URL = "https://example.org/feed"


@pytest.fixture
def api(serve: Callable[..., Served]) -> Served:
    return serve()


def _client(served: Served) -> httpx.Client:
    return served.client(WRITER)


def _create(served: Served, **fields: Any) -> dict[str, Any]:
    with _client(served) as client:
        res = client.post("/v1/jobs", json={"url": URL, "interval_s": 60, **fields})
    assert res.status_code == 201, res.text
    body: dict[str, Any] = res.json()
    return body


def _defs(served: Served) -> dict[str, str]:
    return {str(k): str(v) for k, v in served.store.client.hgetall(served.store.keys.defs).items()}


# ------------------------------------------------------------------- create
def test_a_post_creates_the_job_with_its_state_location_and_etag(api: Served) -> None:
    with _client(api) as client:
        res = client.post("/v1/jobs", json={"url": URL, "interval_s": 60, "queue": "eu"})
    assert res.status_code == 201, res.text
    body = res.json()
    info = api.store.get(body["id"])
    assert info.job.url == URL and info.job.interval_s == 60 and info.job.queue == "eu"
    assert res.headers["location"] == f"/v1/jobs/{body['id']}"
    assert res.headers["etag"] == f'"{info.tag}"' and body["etag"] == info.tag
    assert body["definition"]["url"] == URL and body["kind"] == "interval"
    assert body["state"]["status"] == "scheduled"
    assert body["state"]["next_run_ms"] == info.due_ms


def test_a_post_for_an_id_that_exists_is_409_and_changes_nothing(api: Served) -> None:
    first = _create(api, name="first")
    before = _defs(api)
    with _client(api) as client:
        res = client.post("/v1/jobs", json={"url": URL, "interval_s": 5, "name": "second"})
    assert res.status_code == 409 and res.json()["field"] == "id"
    assert _defs(api) == before
    assert api.store.get(first["id"]).job.name == "first"


@pytest.mark.parametrize(("body", "field"), [
    ({"url": URL, "cron": "61 * * * *"}, "cron"),
    ({"url": URL, "interval_s": -1}, "interval_s"),
    ({"url": URL, "timezone": "Mars/Olympus"}, "timezone"),
    ({"url": "ftp://example.org/"}, "url"),
    ({"url": URL, "colour": "red"}, "colour"),
    ({"url": URL, "interval_s": 60, "cron": "* * * * *"}, "cron"),
])
def test_an_invalid_definition_is_400_naming_the_field_and_writes_nothing(
        api: Served, body: dict[str, Any], field: str) -> None:
    with _client(api) as client:
        res = client.post("/v1/jobs", json=body)
    assert res.status_code == 400, res.text
    assert res.headers["content-type"] == "application/problem+json"
    assert res.json()["field"] == field and field in res.json()["detail"]
    assert _defs(api) == {}


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b'"a string"'])
def test_a_body_that_is_not_a_json_object_is_400_naming_the_body(api: Served, raw: bytes) -> None:
    with _client(api) as client:
        res = client.post("/v1/jobs", content=raw, headers={"Content-Type": "application/json"})
    assert res.status_code == 400 and res.json()["field"] == "body"
    assert _defs(api) == {}


def test_an_oversized_body_is_413_and_writes_nothing(api: Served) -> None:
    with _client(api) as client:
        res = client.post("/v1/jobs", json={"url": URL, "meta": {"pad": "x" * 300_000}})
    assert res.status_code == 413
    assert _defs(api) == {}


# ---------------------------------------------------------- Idempotency-Key
def test_a_retried_post_with_its_idempotency_key_gets_the_first_answer(api: Served) -> None:
    with _client(api) as client:
        key = {"Idempotency-Key": "create-feed-1"}
        first = client.post("/v1/jobs", json={"url": URL}, headers=key)
        again = client.post("/v1/jobs", json={"url": URL}, headers=key)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert again.headers["location"] == first.headers["location"]
    changes = audit_log.history(api.store, first.json()["id"])
    assert [c.action for c in changes] == ["create"]


def test_the_same_idempotency_key_with_another_body_is_422(api: Served) -> None:
    with _client(api) as client:
        key = {"Idempotency-Key": "k"}
        assert client.post("/v1/jobs", json={"url": URL}, headers=key).status_code == 201
        res = client.post("/v1/jobs", json={"url": URL + "?other"}, headers=key)
    assert res.status_code == 422 and res.json()["field"] == "Idempotency-Key"
    assert len(_defs(api)) == 1


def test_a_refused_post_is_replayed_too_and_keys_are_per_token(
        serve: Callable[..., Served]) -> None:
    other = "second-writer-token-0123"
    api = serve(api_tokens=f"{WRITER}:write,{other}:write")
    body = {"url": URL, "cron": "bad"}
    with _client(api) as client:
        first = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k"})
        again = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k"})
    assert first.status_code == again.status_code == 400 and again.json() == first.json()
    with api.client(other) as client:  # the same key from another token is its own
        res = client.post("/v1/jobs", json={"url": URL}, headers={"Idempotency-Key": "k"})
    assert res.status_code == 201 and "idempotent-replayed" not in res.headers


def test_concurrent_posts_with_one_idempotency_key_create_one_job(api: Served) -> None:
    def post(_: int) -> httpx.Response:
        with _client(api) as client:
            return client.post("/v1/jobs", json={"url": URL},
                               headers={"Idempotency-Key": "burst"})

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(post, range(16)))
    statuses = sorted(res.status_code for res in answers)
    assert set(statuses) <= {201, 409}, statuses
    fresh = [res for res in answers
             if res.status_code == 201 and "idempotent-replayed" not in res.headers]
    assert len(fresh) == 1
    assert all(res.json() == fresh[0].json() for res in answers if res.status_code == 201)
    assert len(_defs(api)) == 1
    assert [c.action for c in audit_log.history(api.store, fresh[0].json()["id"])] == ["create"]


def test_a_bad_idempotency_key_is_400(api: Served) -> None:
    with _client(api) as client:
        res = client.post("/v1/jobs", json={"url": URL}, headers={"Idempotency-Key": "k" * 256})
    assert res.status_code == 400 and res.json()["field"] == "Idempotency-Key"
    assert _defs(api) == {}


# --------------------------------------------------------------------- read
def test_a_get_answers_the_definition_live_state_and_next_fires(api: Served) -> None:
    created = _create(api, cron="30 2 * * *", timezone="Europe/Berlin", interval_s=None,
                      jitter_s=0)
    with _client(api) as client:
        res = client.get(f"/v1/jobs/{created['id']}", params={"fires": 3})
    assert res.status_code == 200
    body = res.json()
    assert body["kind"] == "cron" and body["definition"]["timezone"] == "Europe/Berlin"
    assert len(body["fires"]) == 3
    assert all(fire["local"][11:16] == "02:30" for fire in body["fires"])
    assert body["fires"][0]["utc"].startswith(body["state"]["next_run_at"][:16])


def test_unknown_ids_are_404_naming_only_the_id_asked_for(api: Served) -> None:
    _create(api, name="a secret name")
    with _client(api) as client:
        for res in (client.get("/v1/jobs/nope"), client.patch("/v1/jobs/nope", json={}),
                    client.delete("/v1/jobs/nope"), client.post("/v1/jobs/nope:run"),
                    client.get("/v1/jobs/nope/executions")):
            assert res.status_code == 404, res.text
            assert "secret" not in res.text and "example.org" not in res.text


def test_an_id_with_a_slash_and_a_colon_is_reachable(api: Served) -> None:
    _create(api, id="site/a:b")
    with _client(api) as client:
        assert client.get("/v1/jobs/site%2Fa:b").json()["id"] == "site/a:b"
        assert client.post("/v1/jobs/site%2Fa:b:run").status_code == 202
        assert client.get("/v1/jobs/site%2Fa:b/executions").status_code == 200
        assert client.delete("/v1/jobs/site%2Fa:b").status_code == 204
    assert _defs(api) == {}


# --------------------------------------------------------------------- edit
def test_a_patch_replaces_the_fields_given_and_moves_a_changed_schedule(api: Served) -> None:
    created = _create(api, name="old", queue="eu")
    with _client(api) as client:
        res = client.patch(f"/v1/jobs/{created['id']}",
                           json={"name": "new", "cron": "0 3 * * *", "queue": None})
    assert res.status_code == 200, res.text
    job = api.store.get(created["id"]).job
    assert (job.name, job.cron, job.interval_s, job.queue) == ("new", "0 3 * * *", None, None)
    assert job.url == URL
    assert res.json()["state"]["next_run_ms"] != created["state"]["next_run_ms"]
    assert res.headers["etag"] != f'"{created["etag"]}"'
    (change, _) = audit_log.history(api.store, created["id"])
    assert change.action == "edit" and change.actor.kind == "api"


def test_a_patch_with_a_stale_if_match_is_412_and_changes_nothing(api: Served) -> None:
    created = _create(api)
    etag = f'"{created["etag"]}"'
    with _client(api) as client:
        assert client.patch(f"/v1/jobs/{created['id']}", json={"name": "a"},
                            headers={"If-Match": etag}).status_code == 200
        res = client.patch(f"/v1/jobs/{created['id']}", json={"name": "b"},
                           headers={"If-Match": etag})
    assert res.status_code == 412 and res.json()["field"] == "If-Match"
    assert api.store.get(created["id"]).job.name == "a"


def test_concurrent_patches_of_different_fields_lose_neither(api: Served) -> None:
    created = _create(api)
    path = f"/v1/jobs/{created['id']}"

    def edit(field: str, rounds: int = 15) -> None:
        with _client(api) as client:
            for n in range(rounds):
                res = client.patch(path, json={field: f"{field}-{n}"})
                assert res.status_code == 200, res.text

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(edit, ["name", "queue"]))
    job = api.store.get(created["id"]).job
    assert (job.name, job.queue) == ("name-14", "queue-14")


def test_a_patch_pauses_and_resumes(api: Served) -> None:
    created = _create(api)
    path = f"/v1/jobs/{created['id']}"
    with _client(api) as client:
        paused = client.patch(path, json={"status": "paused"})
        assert paused.status_code == 200 and paused.json()["state"]["status"] == "paused"
        assert api.store.get(created["id"]).paused
        assert paused.json()["state"]["next_run_ms"] is None
        resumed = client.patch(path, json={"status": "active"})
    assert resumed.json()["state"]["status"] == "scheduled"
    assert not api.store.get(created["id"]).paused
    ops = [c.action for c in audit_log.history(api.store, created["id"])]
    assert ops[:2] == ["resume", "pause"]


@pytest.mark.parametrize(("patch", "field"), [
    ({"id": "other"}, "id"), ({"interval_s": 0}, "interval_s"),
    ({"status": "sleeping"}, "status"), ({"status": "paused", "enabled": True}, "status"),
    ({"timezone": "Nowhere/City"}, "timezone"),
])
def test_a_bad_patch_is_400_naming_the_field_and_changes_nothing(
        api: Served, patch: dict[str, Any], field: str) -> None:
    created = _create(api)
    before = _defs(api)
    with _client(api) as client:
        res = client.patch(f"/v1/jobs/{created['id']}", json=patch)
    assert res.status_code == 400 and res.json()["field"] == field, res.text
    assert _defs(api) == before and not api.store.get(created["id"]).paused


def test_a_beat_schedule_job_refuses_edits_and_delete_but_pauses(api: Served) -> None:
    api.store.upsert(Job.from_dict({"id": "static-1", "url": URL}), static=True)
    with _client(api) as client:
        assert client.patch("/v1/jobs/static-1", json={"name": "x"}).status_code == 409
        assert client.delete("/v1/jobs/static-1").status_code == 409
        assert client.patch("/v1/jobs/static-1", json={"status": "paused"}).status_code == 200
        assert client.get("/v1/jobs/static-1").json()["static"] is True
    assert api.store.get("static-1").paused


# ------------------------------------------------------------ delete and run
def test_a_delete_removes_the_job_and_a_second_is_404(api: Served) -> None:
    created = _create(api)
    with _client(api) as client:
        assert client.delete(f"/v1/jobs/{created['id']}").status_code == 204
        assert client.get(f"/v1/jobs/{created['id']}").status_code == 404
        assert client.delete(f"/v1/jobs/{created['id']}").status_code == 404
    assert _defs(api) == {}
    assert api.store.client.zcard(api.store.keys.schedule) == 0


def test_run_makes_a_job_due_now_and_leaves_one_in_flight_alone(api: Served) -> None:
    api.store.upsert(http_job("later", interval_s=3600, start_at=4_000_000_000))
    with _client(api) as client:
        res = client.post("/v1/jobs/later:run")
        assert res.status_code == 202 and res.json()["ran"] is True
        assert api.store.get("later").due_ms is not None
        assert api.store.get("later").due_ms <= api.store.now_ms()  # type: ignore[operator]
        with api.client(WORKER) as worker:
            assert worker.get("/jobs/next", params={"timeout": 0}).status_code == 200
        res = client.post("/v1/jobs/later:run")
    assert res.status_code == 202 and res.json()["ran"] is False
    assert api.store.get("later").status == "running"


# --------------------------------------------------------------- executions
def test_executions_list_a_jobs_runs_newest_first_a_page_at_a_time(api: Served) -> None:
    api.store.upsert(http_job("busy", interval_s=0.001, retry_base_s=0.001))
    api.store.upsert(http_job("other", interval_s=0.001))
    outcomes = ["complete", "error", "complete", "complete", "error"]
    with api.client(WORKER) as worker:
        for outcome in outcomes:
            for _ in range(2):  # one of "busy" and one of "other" each round
                job = worker.get("/jobs/next", params={"timeout": 2}).json()
                report = {"lease": job["lease"], "error": f"boom {job['id']}"}
                if job["id"] == "other" or outcome == "complete":
                    report.pop("error")
                    kind = "complete"
                else:
                    kind = "error"
                assert worker.post(f"/jobs/{job['id']}/{kind}", json=report).status_code == 200
    with _client(api) as client:
        first = client.get("/v1/jobs/busy/executions", params={"limit": 3}).json()
        rest = client.get("/v1/jobs/busy/executions",
                          params={"limit": 3, "before": first["next_cursor"]}).json()
    runs = first["items"] + rest["items"]
    assert len(first["items"]) == 3 and len(runs) == 5
    assert [run["status"] for run in runs] == [
        "complete" if o == "complete" else "retrying" for o in reversed(outcomes)]
    assert runs[0]["error"] == "boom busy" and runs[1]["error"] is None
    assert [r["id"] for r in runs] == sorted((r["id"] for r in runs), reverse=True)
    assert all(run["timings"]["transport"] == "http" for run in runs)


def test_a_bad_executions_cursor_is_400(api: Served) -> None:
    _create(api, id="x")
    with _client(api) as client:
        res = client.get("/v1/jobs/x/executions", params={"before": "drop table"})
    assert res.status_code == 400 and res.json()["field"] == "before"


# ------------------------------------------------------------------- import
def _import(api: Served, raw: bytes, content_type: str = "application/json",
            **params: Any) -> httpx.Response:
    with _client(api) as client:
        return client.post("/v1/jobs:import", content=raw, params=params,
                           headers={"Content-Type": content_type})


def test_an_import_stores_every_row_staggered_over_the_interval(api: Served) -> None:
    rows = [{"url": f"https://site{n}.example/", "interval_s": 100, "jitter_s": 0}
            for n in range(200)]
    now = api.store.now_ms()
    res = _import(api, json.dumps(rows).encode())
    after = api.store.now_ms()
    assert res.status_code == 200, res.text
    assert res.json()["created"] == 200 and res.json()["total"] == 200
    dues = sorted(int(score) for _, score in api.store.client.zrange(
        api.store.keys.schedule, 0, -1, withscores=True))
    assert len(dues) == 200
    # Spread over the interval from the import, not all now (bounds on Redis' clock,
    # however long a loaded host took to serve the request).
    assert dues[0] - after < 2_000 and dues[-1] - now > 90_000
    again = _import(api, json.dumps(rows).encode())
    assert again.json()["created"] == 0 and again.json()["updated"] == 200


def test_an_import_with_one_bad_row_is_400_listing_each_row_and_writes_nothing(
        api: Served) -> None:
    raw = (b'{"url": "https://a.example/"}\n'
           b'{"url": "https://b.example/", "cron": "99 * * * *"}\n'
           b'{"url": "https://c.example/", "interval_s": "soon"}\n')
    res = _import(api, raw, "application/x-ndjson")
    assert res.status_code == 400
    body = res.json()
    assert body["error_count"] == 2 and body["field"] == "cron"
    assert [(e["line"], e["field"]) for e in body["errors"]] == [(2, "cron"), (3, "interval_s")]
    assert _defs(api) == {}


def test_an_import_reads_csv_and_dry_run_writes_nothing(api: Served) -> None:
    raw = b"url,interval_s,queue\nhttps://a.example/,60,eu\nhttps://b.example/,120,\n"
    dry = _import(api, raw, "text/csv", dry_run="true")
    assert dry.status_code == 200 and dry.json()["total"] == 2 and dry.json()["dry_run"]
    assert _defs(api) == {}
    res = _import(api, raw, "application/octet-stream", format="csv")
    assert res.json()["created"] == 2
    assert {j.queue for j in api.store.iter_jobs()} == {"eu", None}


@pytest.mark.parametrize(("raw", "content_type", "status", "field"), [
    (b"[{]", "application/json", 400, "file"),
    (b"\xff\xfe", "application/json", 400, "file"),
    (b"[]", "application/xml", 400, "format"),
    (b"nope,url\n1,2\n", "text/csv", 400, "nope"),
])
def test_a_bad_import_file_is_400_naming_the_field(
        api: Served, raw: bytes, content_type: str, status: int, field: str) -> None:
    res = _import(api, raw, content_type)
    assert res.status_code == status and res.json()["field"] == field, res.text
    assert _defs(api) == {}


def test_an_oversized_import_is_413(api: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imports, "MAX_IMPORT_BYTES", 1000)
    raw = json.dumps([{"url": f"https://s{n}.example/"} for n in range(100)]).encode()
    res = _import(api, raw)
    assert res.status_code == 413
    assert _defs(api) == {}


def test_a_retried_import_with_its_idempotency_key_runs_once(api: Served) -> None:
    raw = json.dumps([{"url": "https://a.example/"}]).encode()
    with _client(api) as client:
        headers = {"Content-Type": "application/json", "Idempotency-Key": "import-1"}
        first = client.post("/v1/jobs:import", content=raw, headers=headers)
        again = client.post("/v1/jobs:import", content=raw, headers=headers)
    assert first.json()["created"] == 1
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
