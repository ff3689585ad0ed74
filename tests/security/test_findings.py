"""Each finding of issue 20 as a regression test against a real server (uvicorn on a free
port with the server's own configuration, or a ``zsched serve`` process).

Every test here failed on the code before the fix: the ``500`` of a cursor, the event
loop held by a cron parse, ids that curl and httpx rewrote into another job's, leases
that depended on the order of the tokens, replays that depended on the header's
spelling, wake-ups that claimed once per queue filter, and 400s naming one field.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from celery_zsched.config import Settings
from celery_zsched.core.errors import ConfigurationError
from celery_zsched.server import jobs as jobs_module
from celery_zsched.server.lease import Lease, LeaseSigner
from celery_zsched.store import Store
from tests.gateway.conftest import (
    LEASE_SECRET,
    READER,
    REPO,
    TOKENS,
    WORKER,
    WRITER,
    Served,
    http_job,
)

URL = "https://example.org/"


# ------------------------------------------------------------------ cursors
@pytest.mark.parametrize("before", ["0-0", f"{2**64}-0", f"0-{2**64}", "1-" + "9" * 20, "0-\u0661",
                                    "-1-0", "1-1-1", "x", "", "1", " 1-0"])
def test_an_executions_cursor_redis_would_refuse_is_a_400_naming_before(
        serve: Callable[..., Served], before: str) -> None:
    served = serve()
    served.store.upsert(http_job("cur"))
    with served.client(READER) as client:
        answer = client.get("/v1/jobs/cur/executions", params={"before": before})
    assert answer.status_code == 400, answer.text
    assert answer.json()["field"] == "before"


def test_the_largest_valid_cursor_reads_back(serve: Callable[..., Served]) -> None:
    served = serve()
    served.store.upsert(http_job("cur"))
    with served.client(READER) as client:
        answer = client.get("/v1/jobs/cur/executions", params={"before": f"{2**64 - 1}-0"})
    assert answer.status_code == 200, answer.text


# --------------------------------------------------------------- CPU parses
def test_a_huge_cron_is_refused_before_croniter_sees_it(serve: Callable[..., Served]) -> None:
    served = serve()
    with served.client(WRITER) as client:
        answer = client.post("/v1/jobs", json={"url": URL, "cron": "* " * 60_000})
    assert answer.status_code == 400
    assert answer.json()["field"] == "cron" and "at most 120" in answer.json()["detail"]


def test_a_create_is_parsed_off_the_event_loop(serve: Callable[..., Served],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # The parse blocks until the poll below is answered: on the event loop, it
    # would hold the loop and the poll could never be answered (a deadlock, not a
    # slow answer, so a loaded machine cannot blur the result).
    served = serve()
    answered = threading.Event()
    original = jobs_module._parsed_new

    def slow_parse(*args: Any) -> Any:
        assert answered.wait(30), "the poll was not answered while a create was parsed"
        return original(*args)

    monkeypatch.setattr(jobs_module, "_parsed_new", slow_parse)
    created: list[httpx.Response] = []
    creator = threading.Thread(target=lambda: created.append(
        served.client(WRITER, timeout=60).post("/v1/jobs", json={"url": URL})))
    creator.start()
    with served.client(WORKER, timeout=30) as client:
        assert client.get("/jobs/next", params={"timeout": 0}).status_code == 204
    answered.set()
    creator.join(60)
    assert created[0].status_code == 201


# ---------------------------------------------------------------------- ids
@pytest.mark.parametrize("job_id", ["..", ".", "a/../b", "a/./b", "x/executions", "/a", "a/",
                                    "a//b"])
def test_ids_that_paths_would_rewrite_are_refused_everywhere(
        serve: Callable[..., Served], job_id: str) -> None:
    served = serve()
    with served.client(WRITER) as client:
        created = client.post("/v1/jobs", json={"id": job_id, "url": URL})
        imported = client.post("/v1/jobs:import", params={"format": "jsonl"},
                               content=json.dumps({"id": job_id, "url": URL}).encode())
    assert created.status_code == 400 and created.json()["field"] == "id", created.text
    assert imported.status_code == 400 and imported.json()["field"] == "id", imported.text


def test_curl_and_httpx_path_normalisation_cannot_reach_another_job(
        serve: Callable[..., Served]) -> None:
    served = serve()
    with served.client(WRITER) as client:
        assert client.post("/v1/jobs", json={"id": "b", "url": URL}).status_code == 201
        # The id the finding used cannot exist, so no request can mean it ...
        assert client.post("/v1/jobs", json={"id": "a/../b", "url": URL}).status_code == 400
        # ... and a path that still holds a dot segment (sent as is) is refused, not routed.
        raw = subprocess.run(["curl", "-s", "--path-as-is", "-o", "/dev/null", "-w",
                              "%{http_code}", "-X", "DELETE", "-H",
                              f"Authorization: Bearer {WRITER}",
                              f"{served.url}/v1/jobs/a/../b"],
                             capture_output=True, text=True, timeout=30)
        assert raw.stdout == "400"
        # curl's and httpx's own normalisation turn it into /v1/jobs/b: the client's
        # rewrite (shown here), which no server sees; b is the only job it can name.
        shown = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{url_effective}",
                                f"{served.url}/v1/jobs/a/../b"], capture_output=True,
                               text=True, timeout=30)
        assert shown.stdout.endswith("/v1/jobs/b")
        assert client.build_request("GET", "/v1/jobs/a/../b").url.raw_path == b"/v1/jobs/b"
        assert client.get("/v1/jobs/b").status_code == 200


def test_location_encodes_the_id_and_leads_back_to_the_job(
        serve: Callable[..., Served]) -> None:
    served = serve()
    with served.client(WRITER) as client:
        created = client.post("/v1/jobs", json={"id": "feeds/de:news@1", "url": URL})
        assert created.status_code == 201
        location = created.headers["location"]
        assert location == "/v1/jobs/feeds%2Fde:news@1"
        assert client.get(location).json()["id"] == "feeds/de:news@1"
        followed = subprocess.run(["curl", "-s", "-H", f"Authorization: Bearer {WRITER}",
                                   served.url + location], capture_output=True, text=True,
                                  timeout=30)
        assert json.loads(followed.stdout)["id"] == "feeds/de:news@1"


# -------------------------------------------------------------------- lease key
def _settings(**values: Any) -> Settings:
    return Settings.from_mapping({f"zsched_{k}": v for k, v in values.items()}, env={})


def test_the_lease_key_does_not_depend_on_the_tokens_or_their_order() -> None:
    reordered = ",".join(reversed(TOKENS.split(",")))
    one = LeaseSigner.for_settings(_settings(api_tokens=TOKENS,
                                             gateway_lease_secret=LEASE_SECRET), "{p}:")
    two = LeaseSigner.for_settings(_settings(api_tokens=reordered + ",another-reader-0001:read",
                                             gateway_lease_secret=LEASE_SECRET), "{p}:")
    lease = Lease("job", 1, 1, 1)
    assert two.read("job", one.token(lease)) == lease
    # A worker who knows every token cannot mint a lease: the old key was theirs.
    old_key = hashlib.sha256(f"celery-zsched lease\0{{p}}:\0{TOKENS}".encode()).digest()
    mac = hmac.new(old_key, b"job\x001\x001", hashlib.sha256).digest()[:16]
    forged = f"1.1.{base64.urlsafe_b64encode(mac).decode().rstrip('=')}"
    assert one.read("job", forged) is None


def test_a_worker_token_without_a_lease_secret_is_refused_with_one_to_set() -> None:
    with pytest.raises(ConfigurationError, match="ZSCHED_GATEWAY_LEASE_SECRET=") as info:
        LeaseSigner.for_settings(_settings(api_tokens=TOKENS), "{p}:")
    suggested = str(info.value).rsplit("=", 1)[1]
    assert len(suggested) >= 32
    with pytest.raises(ConfigurationError, match="at least 32"):
        LeaseSigner.for_settings(_settings(api_tokens=TOKENS, gateway_lease_secret="short"),
                                 "{p}:")
    # No worker token, no lease ever handed out: no secret needed.
    LeaseSigner.for_settings(_settings(api_tokens=f"{READER}:read"), "{p}:")


def test_zsched_serve_refuses_to_start_without_the_secret(redis_url: str) -> None:

    env = {**os.environ, "ZSCHED_REDIS_URL": redis_url, "ZSCHED_API_TOKENS": TOKENS}
    env.pop("ZSCHED_GATEWAY_LEASE_SECRET", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "tests.cli_app", "zsched",
                           "serve", "--port", "1"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 78, done.stderr
    assert "zsched_gateway_lease_secret is required" in done.stdout + done.stderr


def test_a_rotated_secret_accepts_the_previous_one_for_one_lease_period() -> None:
    clock = [1000.0]
    old = LeaseSigner.for_settings(_settings(api_tokens=TOKENS,
                                             gateway_lease_secret=LEASE_SECRET), "{p}:")
    new_secret = "the-new-lease-secret-0123456789abcdef"
    rotated = LeaseSigner.for_settings(
        _settings(api_tokens=TOKENS, gateway_lease_secret=new_secret,
                  gateway_lease_secret_previous=LEASE_SECRET, gateway_lease_s=300),
        "{p}:", clock=lambda: clock[0])
    lease = Lease("job", 5, 2, 3)
    handed_before = old.token(lease)
    assert rotated.read("job", handed_before) == lease
    assert old.read("job", rotated.token(lease)) is None  # it signs with the new one
    clock[0] += 299
    assert rotated.read("job", handed_before) == lease
    clock[0] += 2
    assert rotated.read("job", handed_before) is None
    assert rotated.read("job", rotated.token(lease)) == lease


# ------------------------------------------------------------------ idempotency
@pytest.mark.parametrize("spelling", ["bearer {t}", "Bearer  {t}", "BEARER   {t}", "Bearer\t{t}"])
def test_an_idempotency_key_replays_whatever_the_header_spelling(
        serve: Callable[..., Served], spelling: str) -> None:
    served = serve()
    body = {"url": URL}
    with httpx.Client(base_url=served.url) as client:
        first = client.post("/v1/jobs", json=body, headers={
            "Authorization": f"Bearer {WRITER}", "Idempotency-Key": "k1"})
        assert first.status_code == 201
        again = client.post("/v1/jobs", json=body, headers={
            "Authorization": spelling.format(t=WRITER), "Idempotency-Key": "k1"})
    if "\t" in spelling:  # not a Bearer header at all
        assert again.status_code == 401
        return
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"


# ----------------------------------------------------------------------- wake-ups
def test_a_wake_up_claims_for_the_filters_with_due_jobs_not_for_every_filter(
        make_store: Callable[..., Store], monkeypatch: pytest.MonkeyPatch) -> None:
    from celery_zsched.server.dispatcher import Dispatcher

    store = make_store(api_tokens=TOKENS, max_jitter_s=0.0)
    now = store.now_ms()
    store.upsert_many([http_job(f"due-{n}", queue=f"q{n}", run_at=now / 1000 - 1)
                       for n in range(20)], stagger=False)
    claims: list[str] = []
    original = Store.claim_http

    def counted(self: Store, limit: int, queue: str = "") -> Any:
        claims.append(queue)
        return original(self, limit, queue)

    monkeypatch.setattr(Store, "claim_http", counted)

    async def scenario() -> int:
        dispatcher = Dispatcher(store)
        dispatcher.start()
        try:
            # 300 long-polls on 300 distinct filters; 20 of them have a due job.
            waiters = [dispatcher.enter(f"q{n}") for n in range(300)]
            await asyncio.sleep(0)
            done = [w.future for w in waiters[:20]]
            await asyncio.wait_for(asyncio.gather(*done), 20)
            for waiter in waiters:
                dispatcher.withdraw(waiter)
            return sum(1 for w in waiters if w.future.done() and not w.future.cancelled())
        finally:
            await dispatcher.close()

    served = asyncio.run(scenario())
    assert served == 20
    # One claim per filter that had a due job, not 300 per wake-up.
    assert len(claims) <= 2 * 20, len(claims)
    assert set(claims) <= {f"q{n}" for n in range(20)}


# --------------------------------------------------------------- every bad field
def test_a_body_with_several_bad_fields_names_each_of_them(
        serve: Callable[..., Served]) -> None:
    served = serve()
    with served.client(WRITER) as client:
        answer = client.post("/v1/jobs", json={"url": "ftp://x", "cron": "99 * * * *",
                                               "timezone": "Mars/Olympus", "jitter_s": -1})
        patched = client.post("/v1/jobs", json={"id": "ok", "url": URL})
        edit = client.patch("/v1/jobs/ok", json={"interval_s": -1, "priority": 999})
        params = client.get("/v1/jobs", params={"limit": 0, "kind": "nope"})
    assert patched.status_code == 201
    problem = answer.json()
    assert answer.status_code == 400 and problem["error_count"] == 4, problem
    assert {e["field"] for e in problem["errors"]} == {"url", "cron", "timezone", "jitter_s"}
    assert problem["field"] == "url"  # the first, as before
    assert {e["field"] for e in edit.json()["errors"]} == {"interval_s", "priority"}
    assert {e["field"] for e in params.json()["errors"]} == {"limit", "kind"}


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_a_request_head_over_16_kib_is_refused_400_and_closed_on_either_parser(
        serve: Callable[..., Served], http: str) -> None:
    """httptools has no limit of its own on a request's head: the guard keeps h11's."""
    served = serve(http=http)
    port = int(served.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /jobs/next HTTP/1.1\r\nHost: x\r\n")
        sent = 0
        answer = b""
        try:
            while sent < 1024 * 1024:  # a megabyte of headers, if nothing stops it
                sock.sendall(b"X-Pad: " + b"a" * 1000 + b"\r\n")
                sent += 1009
        except OSError:  # the server closed: what was sent past the cap is refused
            pass
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert sent < 1024 * 1024 or answer  # cut, not read to the end
    # And a request with ordinary headers is served as before.
    with served.client(WORKER) as client:
        assert client.get("/jobs/next", params={"timeout": 0}).status_code == 204
