"""The REST API curl session of the docs (docs/how-to/rest-api.md, once the README's)
runs, as pasted, against a real ``zsched serve``.

The block after the ``rest-api-session`` marker is run with bash; only its
``API=``, ``TOKEN=`` and ``WORKER=`` lines are replaced (this server's address
and tokens). Every answer the session prints ends in ``  → <status>``; the
page shows each answer, abbreviated, in the comment lines after its command,
ending in the same arrow. The statuses must be the page's, in order, and so
must every ``"key":value`` the page shows, with two allowances for what
differs from run to run: a string value abbreviated with ``…`` only has to be
there, and a value of ten or more digits (a time, a stream id) only has to have
the same shape (each run of digits stands for any run of digits).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs_pages import page
from tests.gateway.conftest import WORKER, WRITER, serve_process, stop_process
from tests.helpers import free_port
from tests.servers import RedisServer, running

SESSION_PAGE = "how-to/rest-api.md"
MARKER = "<!-- rest-api-session:"
ARROW = re.compile(r"  → (\d{3})\n")
SHOWN_STATUS = re.compile(r"→ (\d{3})\s*$")
FRAGMENT = re.compile(r'"(\w+)":("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?|true|false|null)')
#: The session's variables this test sets, and the page's must be there to set.
VARIABLES = ("API", "TOKEN", "WORKER")


@dataclass(frozen=True)
class Shown:
    """One answer as the page shows it: the abbreviated text and the status."""

    text: str
    status: int


def session_block(text: str) -> str:
    """The fenced bash block right after the marker (there is exactly one marker)."""
    assert text.count(MARKER) == 1, f"expected one {MARKER!r} in docs/{SESSION_PAGE}"
    after = text.split(MARKER, 1)[1].split("\n", 1)[1]
    assert after.startswith("```bash\n"), "the marker must be right above a ```bash block"
    return after[len("```bash\n"):].split("\n```", 1)[0] + "\n"


def shown_answers(block: str) -> list[Shown]:
    """Each answer the block shows: the comment lines that follow a command up to the
    one ending in ``→ <status>``."""
    lines = block.splitlines()
    answers: list[Shown] = []
    for i, line in enumerate(lines):
        status = SHOWN_STATUS.search(line)
        if not line.startswith("#") or status is None:
            continue
        start = i
        while start > 0 and lines[start - 1].startswith("#"):
            start -= 1
        assert start > 0 and lines[start - 1].strip(), f"answer without a command: {line}"
        text = "".join(part[1:].strip() for part in lines[start:i + 1])
        answers.append(Shown(SHOWN_STATUS.sub("", text), int(status.group(1))))
    return answers


def with_server(block: str, api: str, token: str, worker: str) -> str:
    """The block with this server's address and tokens, run strictly."""
    values = {"API": api, "TOKEN": token, "WORKER": worker}
    for name in VARIABLES:
        pattern = re.compile(rf"^{name}=.*$", re.M)
        assert len(pattern.findall(block)) == 1, f"the session sets {name}= once"
        block = pattern.sub(f"{name}={values[name]}", block)
    return "set -eo pipefail\n" + block


def printed_answers(stdout: str) -> list[tuple[str, int]]:
    """What the session printed, one (body, status) per answer."""
    parts = ARROW.split(stdout)
    assert parts[-1] == "", f"output after the last answer: {parts[-1]!r}"
    return [(parts[i], int(parts[i + 1])) for i in range(0, len(parts) - 1, 2)]


def fragment_pattern(key: str, value: str) -> re.Pattern[str]:
    """What an answer must contain for the README's ``"key":value``."""
    if "…" in value:
        return re.compile(re.escape(f'"{key}":"'))
    if sum(c.isdigit() for c in value) >= 10:
        shape = r"\d+".join(re.escape(p) for p in re.split(r"\d+", value))
        return re.compile(re.escape(f'"{key}":') + shape)
    return re.compile(re.escape(f'"{key}":{value}'))


def mismatches(shown: list[Shown], printed: list[tuple[str, int]]) -> list[str]:
    """Where the printed answers differ from the page's (empty: they agree)."""
    if [s.status for s in shown] != [status for _, status in printed]:
        return [f"statuses: page {[s.status for s in shown]}, "
                f"server {[status for _, status in printed]}"]
    problems = []
    for n, (want, (body, _)) in enumerate(zip(shown, printed, strict=True), 1):
        for key, value in FRAGMENT.findall(want.text):
            if not fragment_pattern(key, value).search(body):
                problems.append(f"answer {n}: the page shows \"{key}\":{value}; server: {body}")
    return problems


def test_the_checker_catches_a_wrong_status_a_wrong_value_and_a_missing_key() -> None:
    shown = [Shown('{"id":"news","runs":0,"etag":"ab…","at":"2026-11-24T05:32:06Z"}', 201)]
    body = '{"id":"news","runs":0,"etag":"ff00","at":"2031-01-02T03:04:05Z"}'
    assert mismatches(shown, [(body, 201)]) == []
    assert mismatches(shown, [(body, 200)])
    assert mismatches(shown, [(body.replace('"runs":0', '"runs":1'), 201)])
    assert mismatches(shown, [(body.replace('"etag"', '"tag"'), 201)])
    assert mismatches(shown, [(body.replace("2031-01-02T", "2031-01-02 "), 201)])


def test_the_readme_shows_an_answer_for_every_call_it_makes() -> None:
    block = session_block(page(SESSION_PAGE))
    calls = len(re.findall(r"^\s*(?:api |curl -s -w )", block, re.M))
    assert len(shown_answers(block)) == calls >= 10


@pytest.mark.slow
def test_the_readme_curl_session_gets_the_statuses_and_values_it_shows(tmp_path: Path) -> None:
    block = session_block(page(SESSION_PAGE))
    shown = shown_answers(block)
    port = free_port()
    with running(RedisServer(tmp_path / "redis")) as (redis_server,):
        proc = serve_process(redis_server.url(), "{readme}:", port)
        try:
            script = with_server(block, f"http://127.0.0.1:{port}", WRITER, WORKER)
            run = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True,
                                 text=True, timeout=120)
        finally:
            log = stop_process(proc)
    assert run.returncode == 0, f"{run.stderr}\n{run.stdout}\nserver:\n{log}"
    problems = mismatches(shown, printed_answers(run.stdout))
    assert problems == [], "\n".join(problems) + f"\nserver:\n{log}"
