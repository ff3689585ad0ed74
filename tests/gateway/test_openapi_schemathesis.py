"""Schemathesis over every operation of the OpenAPI document, against a live server.

One ``zsched serve`` process (on the session's throwaway redis-server, a key
prefix of its own) serves the whole module. The document is the checked-in
``docs/openapi.json`` (tests/gateway/test_openapi_document.py proves the server
serves exactly that one). The calls are
property-based: valid and invalid paths, queries and bodies, with the ids of
seeded jobs and the lease tokens of claimed ones mixed in, so reads, edits,
deletes, runs and reports reach existing jobs, not only the 404 and 400 paths.
Every answer must be documented: no 5xx, its status code, its content type,
its body's schema and its declared headers.

``ZSCHED_SOAK=1`` runs many more examples per operation.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.gateway.conftest import REPO, WORKER, WRITER, serve_process, stop_process
from tests.helpers import free_port
from tests.strategies import VALID_JSON_ROWS

SOAK = os.environ.get("ZSCHED_SOAK") == "1"
#: Examples per operation, valid and invalid.
EXAMPLES = 1000 if SOAK else 60
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance]
#: Jobs the module seeds: most HTTP ones are claimed for their lease tokens.
HTTP_IDS = [f"st-http-{n}" for n in range(28)] + ["st/with/slashes", "st:colon@x"]
CELERY_IDS = ["st-celery-1", "st-celery-2"]
#: Jobs only DELETE may pick, so that it leaves the others to the other operations.
DOOMED_IDS = [f"st-doomed-{n}" for n in range(8)]
#: The gateway's reports, each with leases of its own (a report spends its lease).
REPORTS = ("complete", "error", "heartbeat", "report")
LEASES_EACH = 6


@dataclass
class LiveApi:
    """The server under test, and what the module seeded in it."""

    url: str
    ids: list[str]
    doomed: list[str]
    #: Per report: (job id, lease token) of claimed HTTP jobs.
    leases: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    #: Per operation: how often each status code was answered.
    answers: dict[str, Counter[int]] = field(default_factory=dict)


def _seed(url: str) -> LiveApi:
    writer = {"Authorization": f"Bearer {WRITER}"}
    worker = {"Authorization": f"Bearer {WORKER}"}
    jobs: list[dict[str, Any]] = [
        {"id": job_id, "url": f"http://target.invalid/{n}", "transport": "http",
         "interval_s": 60, "jitter_s": 0} for n, job_id in enumerate(HTTP_IDS)]
    jobs += [{"id": CELERY_IDS[0], "task": "tasks.fetch", "cron": "*/5 * * * *",
              "timezone": "Europe/Berlin"},
             {"id": CELERY_IDS[1], "url": "http://target.invalid/c", "interval_s": 3600}]
    jobs += [{"id": job_id, "task": "tasks.fetch", "interval_s": 3600} for job_id in DOOMED_IDS]
    api = LiveApi(url, [*HTTP_IDS, *CELERY_IDS], DOOMED_IDS)
    with httpx.Client(base_url=url, timeout=10) as client:
        for job in jobs:
            assert client.post("/v1/jobs", json=job, headers=writer).status_code == 201, job
        # Claimed for the reports' leases; the rest stay due for GET /jobs/next.
        for report in REPORTS:
            for _ in range(LEASES_EACH):
                answer = client.get("/jobs/next", params={"timeout": 0}, headers=worker)
                assert answer.status_code == 200, answer.text
                offer = answer.json()
                api.leases.setdefault(report, []).append((offer["id"], offer["lease"]))
    return api


@pytest.fixture(scope="module")
def live_api(redis_server: Any) -> Iterator[LiveApi]:
    """A ``zsched serve`` process with seeded jobs; 0.2 s long polls keep the run short."""
    port = free_port()
    proc = serve_process(f"redis://{redis_server.host}:{redis_server.port}/0",
                         f"st{uuid.uuid4().hex[:8]}", port, gateway_timeout_s=0.2)
    try:
        yield _seed(f"http://127.0.0.1:{port}")
    finally:
        stop_process(proc)


def _choices(case: Any, api: LiveApi) -> list[tuple[str, str | None] | None]:
    """What may stand in for a case's job id: nothing, a seeded id, or for a report a
    claimed job's id and lease."""
    if case.path == "/jobs/report":
        return [None, *api.leases["report"]]
    if "job_id" not in (case.path_parameters or {}):
        return [None]
    if case.path.startswith("/jobs/"):
        return [None, *api.leases[case.path.rpartition("/")[2]]]
    ids = api.doomed if case.method.upper() == "DELETE" else api.ids
    return [None, *((job_id, None) for job_id in ids)]


def _swap(case: Any, choice: tuple[str, str | None] | None) -> None:
    if choice is None:
        return
    job_id, lease = choice
    if case.path == "/jobs/report":
        reports = case.body.get("reports") if isinstance(case.body, dict) else None
        if isinstance(reports, list) and reports and isinstance(reports[0], dict):
            # The batch's first report on a claimed job: it may apply.
            case.body = {**case.body, "reports": [{**reports[0], "id": job_id,
                                                   "lease": lease}, *reports[1:]]}
        return
    case.path_parameters = {**case.path_parameters, "job_id": job_id}
    if lease is not None and isinstance(case.body, dict):
        case.body = {**case.body, "lease": lease}


schema = schemathesis.openapi.from_path(REPO / "docs" / "openapi.json")
# Schemathesis' own pytest items (@schema.parametrize) all get one node id under
# pytest 9, and pytest-xdist then runs the first operation only: plain parametrize.
OPERATIONS = [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda operation: operation.label)
@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_operation_answers_as_documented(operation: Any, data: st.DataObject,
                                               live_api: LiveApi) -> None:
    """No 5xx, and every status, content type, body and header as the document says."""
    token = WORKER if operation.path.startswith("/jobs/") else WRITER
    auth = {"Authorization": f"Bearer {token}"}
    mode = data.draw(st.sampled_from(list(GenerationMode)), label="mode")
    case = data.draw(operation.as_strategy(generation_mode=mode, headers=auth), label="case")
    _swap(case, data.draw(st.sampled_from(_choices(case, live_api)), label="known id"))
    if operation.label == "POST /v1/jobs" and data.draw(st.booleans(), label="valid"):
        # Generated bodies rarely pass Job.from_dict (a zone, a cron): mix in valid ones.
        case.body = data.draw(VALID_JSON_ROWS, label="valid job")
    started = time.monotonic()
    response = case.call_and_validate(base_url=live_api.url, checks=CHECKS, timeout=10,
                                      headers=auth)
    # A long poll is capped at the server's 0.2 s: a stall means a hang, not a wait.
    assert time.monotonic() - started < 5
    live_api.answers.setdefault(operation.label, Counter())[response.status_code] += 1


def test_every_operation_was_called_and_reached_success(live_api: LiveApi) -> None:
    """Runs after the calls above (same module, same worker): each operation got past
    its 400s and 404s at least once, so the checks saw its documented success too."""
    operations = {operation.label for operation in OPERATIONS}
    print("\n".join(f"{op}: {sorted(live_api.answers.get(op, {}).items())}"
                    for op in sorted(operations)))
    assert set(live_api.answers) == operations
    failed = [op for op, seen in live_api.answers.items()
              if not any(200 <= status < 300 for status in seen)]
    assert not failed, f"never answered 2xx: {failed}"
