"""Every ``zsched`` command's ``--help`` is pinned by a golden file: a change to the
CLI's surface (a command, an option, a default, a help text) shows in review.

The help is rendered through Celery's own CLI, as ``celery -A tests.cli_app zsched
<command> --help`` renders it: click's ``CliRunner`` on Celery's ``celery`` group
(which finds ``zsched`` through the ``celery.commands`` entry point), in-process
because 25 subprocesses would take 12 s; one test runs the real ``celery``
executable and checks it prints the same. The terminal is 100 columns wide and
colourless, so the files do not depend on who runs the tests: on any terminal of 80
columns or more click renders help 78 wide.

One file per command under ``tests/golden/help/``: ``zsched.txt``, ``zsched-add.txt``,
``zsched-dead-list.txt``. A command without a file fails, and so does a file without
a command. After an intended change, regenerate them and review the diff::

    ZSCHED_REGOLDEN=1 pytest tests/test_cli_help.py -n 0
    git diff tests/golden/help/
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from celery.bin.celery import celery
from click.testing import CliRunner

from celery_zsched.cli import zsched
from tests.cli_env import APP, ROOT

GOLDEN = ROOT / "tests" / "golden" / "help"
REGOLDEN = os.environ.get("ZSCHED_REGOLDEN") == "1"
#: The terminal the help is rendered for: wide enough that click's cap decides, with
#: no colour.
TERMINAL = {"COLUMNS": "100", "LINES": "40", "NO_COLOR": "1", "TERM": "dumb"}
#: The width click gives help on such a terminal (80, its cap, less 2). ``CliRunner``
#: forces 80 columns instead, so the in-process rendering asks for this width.
HELP_WIDTH = 78


def commands() -> list[tuple[str, ...]]:
    """Every command of the ``zsched`` group, groups and their subcommands included,
    as the words that follow ``zsched`` (``()`` is the group itself)."""
    def walk(command: click.Command, words: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        yield words
        if isinstance(command, click.Group):
            for name in sorted(command.commands):
                yield from walk(command.commands[name], (*words, name))

    return list(walk(zsched, ()))


def golden_file(words: tuple[str, ...]) -> Path:
    return GOLDEN / ("-".join(("zsched", *words)) + ".txt")


def render(words: tuple[str, ...]) -> str:
    """``celery -A tests.cli_app zsched WORDS --help`` through Celery's CLI, in-process."""
    result = CliRunner(env=TERMINAL).invoke(
        celery, ["-A", APP, "zsched", *words, "--help"], prog_name="celery",
        auto_envvar_prefix="CELERY", terminal_width=HELP_WIDTH, catch_exceptions=False, color=False)
    assert result.exit_code == 0, result.output
    return result.output


def _ids(words: tuple[str, ...]) -> str:
    return " ".join(words) or "zsched"


@pytest.fixture(autouse=True)
def _no_zsched_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's ``ZSCHED_*`` and ``CELERY_*`` variables stay out of the help."""
    for name in list(os.environ):
        if name.startswith(("ZSCHED_", "CELERY_")):
            monkeypatch.delenv(name)
    monkeypatch.syspath_prepend(str(ROOT))


@pytest.mark.parametrize("words", commands(), ids=_ids)
def test_help_matches_its_golden_file(words: tuple[str, ...]) -> None:
    rendered = render(words)
    path = golden_file(words)
    if REGOLDEN:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(rendered, "utf-8")
        return
    assert path.exists(), (
        f"`zsched {' '.join(words)}` has no golden help file {path.relative_to(ROOT)}: "
        "run ZSCHED_REGOLDEN=1 pytest tests/test_cli_help.py -n 0 and review it")
    assert rendered == path.read_text("utf-8"), (
        f"`zsched {' '.join(words)} --help` changed: if intended, run "
        "ZSCHED_REGOLDEN=1 pytest tests/test_cli_help.py -n 0 and review the diff")


def test_every_golden_file_names_a_command() -> None:
    expected = {golden_file(words).name for words in commands()}
    stale = sorted(p.name for p in GOLDEN.glob("*.txt") if p.name not in expected)
    if REGOLDEN:
        for name in stale:
            (GOLDEN / name).unlink()
        return
    assert not stale, f"golden help files of commands that no longer exist: {stale}"


def test_the_walk_finds_the_groups_and_their_subcommands() -> None:
    found = commands()
    assert len(found) >= 20
    for words in [(), ("add",), ("dead",), ("dead", "list"), ("domains", "set"), ("serve",)]:
        assert words in found
    # One file per command: "run-now" and a "run" group's "now" would share one.
    assert len({golden_file(words) for words in found}) == len(found)


@pytest.mark.parametrize("words", [(), ("dead", "list")], ids=_ids)
def test_the_celery_executable_prints_the_same_help(words: tuple[str, ...]) -> None:
    """The in-process rendering is what a user's shell shows: ``celery`` run for real,
    its output piped (no colour), with ``COLUMNS=100``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZSCHED_", "CELERY_"))}
    run = subprocess.run(
        [str(Path(sys.executable).parent / "celery"), "-A", APP, "zsched", *words, "--help"],
        cwd=ROOT, env={**env, **TERMINAL}, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == render(words)
