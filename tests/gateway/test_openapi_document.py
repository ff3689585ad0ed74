"""The checked-in OpenAPI document: the one the server serves, and valid OpenAPI 3.1."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import jsonschema_rs
import pytest
import schemathesis

from celery_zsched.server.schema import render
from tests.gateway.conftest import READER, REPO, WORKER, WRITER, Served

CHECKED_IN = REPO / "docs" / "openapi.json"
REGENERATE = "python -m celery_zsched.server.openapi > docs/openapi.json"


def _checked_in() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(CHECKED_IN.read_text(encoding="utf-8"))
    return doc


def test_the_served_document_is_the_checked_in_one_for_every_token(
        serve: Callable[..., Served]) -> None:
    served = serve()
    expected = CHECKED_IN.read_text(encoding="utf-8")
    for token in (WORKER, READER, WRITER):
        with served.client(token) as client:
            answer = client.get("/openapi.json")
        assert answer.status_code == 200, answer.text
        assert render(answer.json()) == expected, (
            f"docs/openapi.json is not what the server serves: regenerate it with\n"
            f"    {REGENERATE}")


def test_the_regeneration_command_prints_the_checked_in_file_byte_for_byte() -> None:
    printed = subprocess.run([sys.executable, "-m", "celery_zsched.server.openapi"],
                             cwd=REPO, capture_output=True, text=True, check=True, timeout=60)
    assert printed.stdout == CHECKED_IN.read_text(encoding="utf-8"), REGENERATE
    assert printed.stdout.endswith("}\n") and '\n  "components": {' in printed.stdout


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = _checked_in()
    assert doc["openapi"].startswith("3.1.")
    schemathesis.openapi.from_dict(doc).validate()


@pytest.mark.parametrize("breakage", ["no info", "a response without description",
                                      "a parameter in the wrong place"])
def test_the_validity_check_refuses_a_broken_document(breakage: str) -> None:
    # The check above can fail: each of these breaks the OpenAPI 3.1 meta-schema.
    doc = copy.deepcopy(_checked_in())
    operation = doc["paths"]["/v1/jobs/{job_id}"]["get"]
    if breakage == "no info":
        del doc["info"]
    elif breakage == "a response without description":
        del operation["responses"]["200"]["description"]
    else:
        operation["parameters"][0]["in"] = "body"
    with pytest.raises(jsonschema_rs.ValidationError):
        schemathesis.openapi.from_dict(doc).validate()


def test_every_error_answer_is_documented_as_problem_json() -> None:
    # The gateway's 409s are the exception: a report's outcome, as plain JSON.
    for path, methods in _checked_in()["paths"].items():
        for method, operation in methods.items():
            for status, response in operation["responses"].items():
                media = set(response.get("content", {}))
                if int(status) < 400:
                    continue
                plain = path.startswith("/jobs/{job_id}") and status == "409"
                expected = {"application/json"} if plain else {"application/problem+json"}
                assert media == expected, f"{method.upper()} {path} {status}: {media}"
            retry = operation["responses"]["503"]["headers"]["Retry-After"]
            assert retry["required"] is True
