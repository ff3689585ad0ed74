"""Every command that prints stored text escapes the control characters in it on a terminal.

A worker's error, a note, a job's name, URL or meta may hold ANSI/OSC escape
sequences, C1 controls or bidirectional overrides. Printed raw they clear the
screen, paint "ALL JOBS HEALTHY" in green, retitle the window or reorder a line.
On a terminal every command shows them escaped (``\\x1b``); piped output is
left as it is. The table below must name every command of the group, so a new
command is tested too.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest

from celery_zsched.cli import helpers, zsched
from celery_zsched.store import Store
from tests.cli_env import APP, ROOT, cli_prefix, invoke
from tests.dead_letters import dead_job, kill

#: What a hostile worker reports: clear the screen, print green, set the title, ring.
EVIL = "\x1b[2J\x1b[H\x1b[32mALL JOBS HEALTHY\x1b[0m\x1b]0;pwned\x07 \x9b31m \u202etxt.exe"
#: Characters a terminal acts on; none may reach it.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
CELERY = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "celery"


@pytest.fixture
def prefix(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from cli_prefix(redis_url, monkeypatch, "tty")


@pytest.fixture
def hostile(make_store: Callable[..., Store], prefix: str, tmp_path: Path) -> dict[str, str]:
    """A store holding hostile text everywhere a command prints from; the values to use."""
    store = make_store(key_prefix=prefix, lease_s=0.05, max_deliveries=1)
    kill(store, [dead_job("dead-1", name=EVIL, meta={"note": EVIL})], error=EVIL)
    store.upsert(dead_job("live-1", name=EVIL, meta={"x": EVIL}, interval_s=60), note=EVIL)
    store.pause("live-1", note=EVIL)
    store.resume("live-1", note=EVIL)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"url": "https://a.test/", "interval_s": EVIL}) + "\n"
                   + json.dumps({"id": "ok-1", "task": "t", "name": EVIL}) + "\n")
    return {"dead": "dead-1", "live": "live-1", "file": str(bad)}


def commands() -> list[str]:
    """Every leaf command of the zsched group, as its words ("dead list")."""
    def walk(group: click.Group, words: tuple[str, ...]) -> Iterator[str]:
        for name, command in group.commands.items():
            if isinstance(command, click.Group):
                yield " ".join((*words, name))
                yield from walk(command, (*words, name))
            else:
                yield " ".join((*words, name))
    return sorted(walk(zsched, ()))


#: The arguments each command runs with ({dead}, {live}, {file}: the fixture's), or
#: why it is not run (it serves until stopped, and prints only its own settings).
CASES: dict[str, list[str] | str] = {
    "add": ["--url", "https://b.test/x", "--name", EVIL],
    "dead": ["list"],
    "dead list": [],
    "dead show": ["{dead}"],
    "dead requeue": ["{dead}", "--note", EVIL],
    "dead purge": ["{dead}"],
    "delete": ["{live}"],
    "domains": ["--json"],
    "domains set": ["b.test", "--delay", "2"],
    "domains reset": ["b.test"],
    "domains refresh": [],
    "export": [],
    "exporter": "serves metrics until stopped; prints its address only",
    "history": ["{live}"],
    "import": ["--file", "{file}", "--skip-invalid"],
    "list": [],
    "next": ["{live}"],
    "pause": ["{live}"],
    "repartition": ["--to", "1"],
    "resume": ["{live}"],
    "run-now": ["{live}"],
    "serve": "serves HTTP until stopped; prints its address only",
    "show": ["{live}"],
    "stats": [],
}


def test_the_table_names_every_command() -> None:
    assert sorted(CASES) == commands()


@pytest.mark.parametrize("command", sorted(CASES))
def test_a_command_on_a_terminal_escapes_stored_control_characters(
        command: str, hostile: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    case = CASES[command]
    if isinstance(case, str):
        pytest.skip(case)
    monkeypatch.setattr(helpers, "on_tty", lambda err=False: True)
    args = [a.format(**hostile) for a in case]
    result = invoke(*command.split(), *args)
    assert result.exit_code in (0, 65), result.output  # 65: the file's bad row
    found = RAW.findall(result.output)
    assert not found, f"raw {found[:5]} in: {result.output!r}"


@pytest.mark.parametrize("command", ["dead list", "dead show", "show", "history", "export"])
def test_commands_that_print_stored_text_show_it_escaped(
        command: str, hostile: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(helpers, "on_tty", lambda err=False: True)
    case = CASES[command]
    assert isinstance(case, list)
    result = invoke(*command.split(), *[a.format(**hostile) for a in case])
    assert result.exit_code == 0, result.output
    assert "\\x1b" in result.output or "\\u001b" in result.output, result.output


def test_piped_output_is_left_as_it_is(hostile: dict[str, str]) -> None:
    # (click itself strips CSI colour sequences from output that is not a terminal.)
    result = invoke("dead", "show", hostile["dead"])
    assert "\x1b]0;pwned\x07 \x9b31m \u202etxt.exe" in result.output


def test_dead_list_on_a_real_terminal_escapes_a_workers_error(
        hostile: dict[str, str], prefix: str) -> None:
    controller, terminal = pty.openpty()
    env = {**os.environ, "ZSCHED_KEY_PREFIX": prefix}
    try:
        proc = subprocess.Popen([str(CELERY), "-A", APP, "zsched", "dead", "list"], cwd=ROOT,
                                env=env, stdout=terminal, stderr=terminal,
                                stdin=subprocess.DEVNULL)
    finally:
        os.close(terminal)
    shown = b""
    try:
        while chunk := os.read(controller, 65536):
            shown += chunk
    except OSError:  # EIO: the terminal's last holder exited
        pass
    finally:
        os.close(controller)
    assert proc.wait(60) == 0, shown
    text = shown.decode()
    assert "dead-1" in text and "\\x1b[2J" in text, text
    assert "\x1b" not in text and "\x07" not in text
