"""The management API's door and walls: who may call which /v1 route, that a rejected
token takes one path whatever it is, that no error shows another job's data, and that
every change it makes is in the audit trail under the token's fingerprint, never the
token."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from celery_zsched.store import audit_log
from tests.gateway.conftest import READER, TOKENS, WORKER, WRITER, Served, http_job
from tests.helpers import store_snapshot

#: A second write token: idempotency keys and fingerprints are per token.
OTHER_WRITER = "other-writer-token-0123456789"
#: In the definitions of the jobs a caller does not ask about: no answer may show it.
SECRET = "s3cret-of-another-job"


@dataclass(frozen=True)
class Call:
    """One request to a /v1 route, and the scope it needs."""

    method: str
    route: str
    path: str
    scope: str
    body: bytes = b""
    content_type: str = "application/json"

    def send(self, client: httpx.Client, **headers: str) -> httpx.Response:
        return client.request(self.method, self.path, content=self.body or None,
                              headers={"Content-Type": self.content_type, **headers})


NEW = json.dumps({"id": "fresh", "url": "https://example.org/fresh", "interval_s": 60}).encode()
ROW = b'{"url": "https://example.org/imported", "interval_s": 60}\n'
#: Every /v1 route (the route table below must list them all), on job ``target``.
CALLS = [
    Call("GET", "/v1/jobs", "/v1/jobs", "read"),
    Call("POST", "/v1/jobs", "/v1/jobs", "write", NEW),
    Call("GET", "/v1/jobs/{job_id}", "/v1/jobs/target?fires=2", "read"),
    Call("PATCH", "/v1/jobs/{job_id}", "/v1/jobs/target", "write",
         b'{"status": "paused"}'),
    Call("POST", "/v1/jobs/{job_id}:run", "/v1/jobs/target:run", "write"),
    Call("GET", "/v1/jobs/{job_id}/executions", "/v1/jobs/target/executions", "read"),
    Call("POST", "/v1/jobs:import", "/v1/jobs:import?format=jsonl", "write", ROW,
         "application/x-ndjson"),
    Call("DELETE", "/v1/jobs/{job_id}", "/v1/jobs/target", "write"),
]


def v1_routes(served: Served) -> set[tuple[str, str]]:
    """The /v1 operations the server's OpenAPI document lists."""
    with served.client(READER) as client:
        paths: dict[str, dict[str, Any]] = client.get("/openapi.json").json()["paths"]
    return {(method.upper(), path) for path, operations in paths.items()
            if path.startswith("/v1") for method in operations}


@pytest.fixture
def served(serve: Callable[..., Served]) -> Served:
    """A server with jobs ``target`` and ``other`` (``other`` holds :data:`SECRET`)."""
    s: Served = serve(api_tokens=f"{TOKENS},{OTHER_WRITER}:write")
    s.store.upsert(http_job("target"))
    s.store.upsert(http_job("other", meta={"note": SECRET}))
    return s


def fingerprint(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def test_the_matrix_covers_every_v1_route(served: Served) -> None:
    assert v1_routes(served) == {(c.method, c.route) for c in CALLS}


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer not-a-token-0123456789"}, {"Authorization": f"Basic {WRITER}"},
    {"Authorization": "Bearer"}, {"Authorization": WRITER},
], ids=["none", "unknown", "basic", "empty", "no-scheme"])
def test_every_v1_route_refuses_a_missing_or_unknown_token_with_401_and_changes_nothing(
        served: Served, headers: dict[str, str]) -> None:
    before = store_snapshot(served.store)
    with served.client(None) as client:
        for call in CALLS:
            res = call.send(client, **headers)
            assert res.status_code == 401, (call, res.text)
            assert res.headers["WWW-Authenticate"].startswith("Bearer")
            assert res.headers["content-type"] == "application/problem+json"
        # Auth comes first: a malformed request without a token says nothing of its errors.
        assert client.get("/v1/jobs?limit=0").status_code == 401
        assert client.patch("/v1/jobs/target", content=b"{not json").status_code == 401
    assert store_snapshot(served.store) == before


@pytest.mark.parametrize(("token", "scope", "grants"), [
    (WORKER, "worker", ()), (READER, "read", ("read",))], ids=["worker", "read"])
def test_a_token_gets_403_on_every_route_outside_its_scope_and_changes_nothing(
        served: Served, token: str, scope: str, grants: tuple[str, ...]) -> None:
    """A worker token can use no /v1 route; a read token every read and no write."""
    before = store_snapshot(served.store)
    with served.client(token) as client:
        for call in CALLS:
            res = call.send(client)
            if call.scope in grants:
                assert res.status_code == 200, (call, res.text)
            else:
                assert res.status_code == 403, (call, res.text)
                assert res.json()["detail"] == \
                    f"this token's scope is {scope}; this needs {call.scope}"
    assert store_snapshot(served.store) == before


def test_a_write_token_may_make_every_call(served: Served) -> None:
    with served.client(WRITER) as client:
        statuses = [call.send(client).status_code for call in CALLS]
    assert statuses == [200, 201, 200, 200, 202, 200, 200, 204]
    assert served.store.get_many(["target"]) == [None]
    assert served.store.get_many(["fresh"])[0] is not None


def test_the_openapi_document_needs_a_token_of_any_scope(served: Served) -> None:
    with served.client(None) as anonymous:
        assert anonymous.get("/openapi.json").status_code == 401
    for token in (READER, WRITER, WORKER):
        with served.client(token) as client:
            assert client.get("/openapi.json").status_code == 200


def test_every_wrong_token_is_checked_against_every_token_and_gets_the_same_answer(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """No early exit and no length shortcut: each token offered, right or wrong, near
    or far, costs one digest comparison per configured token, of 32 bytes each."""
    real = hmac.compare_digest
    compared: list[tuple[int, int]] = []

    def counting(a: Any, b: Any) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    configured = 4
    wrong = [WRITER[:-1] + "x", "x" + WRITER[1:], WRITER[:-1], WRITER + "0",
             WRITER.upper(), "a" * 16, "z" * 4000]
    answers = set()
    with served.client(None) as client:
        for token in [*wrong, READER, WRITER, WORKER, OTHER_WRITER]:
            compared.clear()
            res = client.get("/v1/jobs/target",
                             headers={"Authorization": f"Bearer {token}"})
            assert compared == [(32, 32)] * configured, token
            if token in wrong:
                answers.add((res.status_code, res.headers["WWW-Authenticate"],
                             res.headers["content-length"], res.content))
            else:
                assert res.status_code in (200, 403)
    assert len(answers) == 1, answers
    assert next(iter(answers))[0] == 401


def no_secret(res: httpx.Response, asked: str) -> dict[str, Any]:
    """The error body, checked: it names ``asked`` only, and shows nothing of ``other``."""
    text = res.text + json.dumps(dict(res.headers))
    assert SECRET not in text and "target.invalid/other" not in text, text
    assert "'other'" not in text and '"other"' not in text, text
    body: dict[str, Any] = res.json()
    assert res.headers["content-type"] == "application/problem+json"
    assert set(body) <= {"type", "title", "status", "detail", "field", "row", "errors",
                         "error_count"}, body
    if asked:
        assert f"'{asked}'" in body.get("detail", ""), body
    return body


def test_errors_about_a_job_name_only_the_id_asked_for(served: Served) -> None:
    store = served.store
    store.upsert(http_job("static", meta={"note": SECRET}), static=True)
    before = store_snapshot(store)
    with served.client(WRITER) as client:
        for res in (client.get("/v1/jobs/missing"), client.delete("/v1/jobs/missing"),
                    client.patch("/v1/jobs/missing", json={"status": "paused"}),
                    client.post("/v1/jobs/missing:run"),
                    client.get("/v1/jobs/missing/executions")):
            assert res.status_code == 404
            assert no_secret(res, "missing")["field"] == "id"
        # The id of a job that exists, with another definition: the 409 names the id only.
        taken = client.post("/v1/jobs", json={"id": "other", "url": "https://example.org/x"})
        assert taken.status_code == 409
        assert "other" in taken.json()["detail"]
        assert SECRET not in taken.text and "target.invalid" not in taken.text
        for res in (client.delete("/v1/jobs/static"),
                    client.patch("/v1/jobs/static", json={"interval_s": 5})):
            assert res.status_code == 409
            assert no_secret(res, "")["field"] == "id"
        stale = client.patch("/v1/jobs/target", json={"interval_s": 5},
                             headers={"If-Match": '"0000"'})
        assert stale.status_code == 412
        assert no_secret(stale, "")["field"] == "If-Match"
        renamed = client.patch("/v1/jobs/target", json={"id": "other"})
        assert renamed.status_code == 400
        assert no_secret(renamed, "")["field"] == "id"
    assert store_snapshot(store) == before


def test_an_idempotency_key_of_one_token_never_answers_another(served: Served) -> None:
    """Another client reusing a key gets its own answer, not the first client's job."""
    body = {"id": "keyed", "url": "https://example.org/keyed", "meta": {"note": SECRET}}
    headers = {"Idempotency-Key": "shared-key"}
    with served.client(WRITER) as first, served.client(OTHER_WRITER) as second:
        created = first.post("/v1/jobs", json=body, headers=headers)
        assert created.status_code == 201
        assert first.post("/v1/jobs", json=body, headers=headers).headers[
            "Idempotent-Replayed"] == "true"
        again = second.post("/v1/jobs", json=body, headers=headers)
    assert again.status_code == 409
    assert "Idempotent-Replayed" not in again.headers
    assert SECRET not in again.text


def test_import_errors_show_only_the_rows_sent(served: Served) -> None:
    rows = b'{"id": "other", "interval_s": -1}\n{"url": "https://example.org/ok"}\n'
    before = store_snapshot(served.store)
    with served.client(WRITER) as client:
        res = client.post("/v1/jobs:import?format=jsonl", content=rows)
    assert res.status_code == 400
    body = res.json()
    assert body["error_count"] == 1 and body["errors"][0]["job"] == 1
    assert SECRET not in res.text and "target.invalid" not in res.text
    assert store_snapshot(served.store) == before


def test_api_changes_are_audited_as_api_with_the_tokens_fingerprint_never_the_token(
        served: Served) -> None:
    store = served.store
    with served.client(WRITER) as client, served.client(OTHER_WRITER) as other:
        assert client.post("/v1/jobs", json={"id": "audited", "url": "https://example.org/a",
                                             "interval_s": 60}).status_code == 201
        assert client.patch("/v1/jobs/audited", json={"interval_s": 90}).status_code == 200
        assert other.patch("/v1/jobs/audited", json={"status": "paused"}).status_code == 200
        assert client.patch("/v1/jobs/audited", json={"status": "active"}).status_code == 200
        assert client.post("/v1/jobs/audited:run").status_code == 202
        assert client.delete("/v1/jobs/audited").status_code == 204
        assert client.post("/v1/jobs:import?format=jsonl",
                           content=b'{"id": "imported", "url": "https://example.org/i"}\n'
                           ).status_code == 200
    mine, theirs = f"token {fingerprint(WRITER)}", f"token {fingerprint(OTHER_WRITER)}"
    trail = [(c.action, c.actor.kind, c.actor.name)
             for c in reversed(audit_log.history(store, "audited"))]
    assert trail == [("create", "api", mine), ("edit", "api", mine),
                     ("pause", "api", theirs), ("resume", "api", mine),
                     ("run_now", "api", mine), ("delete", "api", mine)]
    edit = audit_log.history(store, "audited")[-2]
    assert edit.diff == {"interval_s": [60.0, 90.0]}
    [imported] = audit_log.history(store, "imported")
    assert (imported.action, imported.actor.kind, imported.actor.name) == \
        ("create", "api", mine)
    assert imported.note == "bulk import (REST API)"
    raw = json.dumps([store.client.xrange(keys.audit) for keys in store.parts])
    for token in (WRITER, OTHER_WRITER, READER, WORKER):
        assert token not in raw


def test_a_refused_call_records_nothing(served: Served) -> None:
    with served.client(READER) as reader, served.client(None) as anonymous:
        assert reader.patch("/v1/jobs/target", json={"status": "paused"}).status_code == 403
        assert anonymous.delete("/v1/jobs/target").status_code == 401
    assert [c.action for c in audit_log.history(served.store, "target")] == ["create"]
    assert audit_log.history(served.store, "target")[0].actor.kind == "api"
    assert audit_log.history(served.store, "target")[0].actor.name == ""

