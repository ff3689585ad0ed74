"""``celery -A tests.cli_app zsched domains [set|reset]`` and the domain lines of ``zsched stats``,
run in-process through Celery's own CLI against the throwaway Redis of conftest.py.

Live pacing state (429s, Retry-After gates, breakers) is made the way workers
make it: jobs are claimed and settled with an HTTP status through the store.
Every rejected command is checked to have written nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import Result

from celery_zsched.core.job import Job
from celery_zsched.store import Store
from tests.cli_env import cli_prefix, invoke
from tests.helpers import settle_all

UNREACHABLE = "redis://127.0.0.1:1/0"
PACING_OFF_NOTE = "note: zsched_pacing is off"

Run = Callable[..., Result]


@pytest.fixture
def prefix(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh key prefix, passed to the app through the ``ZSCHED_*`` environment."""
    yield from cli_prefix(redis_url, monkeypatch, "dom")


@pytest.fixture
def run(prefix: str) -> Run:
    """Invoke ``celery -A tests.cli_app zsched ARGS``; exceptions are not swallowed."""
    return invoke


@pytest.fixture
def pacing(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Pacing on for the CLI; the same settings for the test's own store (``zstore``).

    No delay and no cap by default, so one claim takes every due job of a
    domain; the breaker opens after two requests.
    """
    values: dict[str, Any] = {"pacing": True, "domain_delay_s": 0.0,
                              "domain_max_in_flight": 0, "breaker_min_requests": 2,
                              "breaker_cooldown_s": 600.0}
    for name, value in values.items():
        monkeypatch.setenv(f"ZSCHED_{name.upper()}", str(value))
    return values


@pytest.fixture
def zstore(make_store: Callable[..., Store], prefix: str, request: pytest.FixtureRequest
           ) -> Store:
    """The store the CLI writes to (with the pacing settings when the test uses them)."""
    overrides = (request.getfixturevalue("pacing")
                 if "pacing" in request.fixturenames else {})
    return make_store(timezone="Europe/Berlin", key_prefix=prefix, **overrides)


def domain_keys(store: Store) -> dict[str, Any]:
    """What any domain command could write: the pacing state and the overrides."""
    return {name: store.client.hgetall(name)
            for name in (store.keys.domains, store.keys.domain_conf)}


def table(result: Result) -> dict[str, dict[str, str]]:
    """The listing's rows by domain, each cell by its header."""
    header, *rows = result.stdout.splitlines()
    # A column starts after two spaces (headers like "DELAY NOW/CONF" hold one).
    starts = [i for i, ch in enumerate(header)
              if ch != " " and (i == 0 or header[i - 2:i] == "  ")]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    out = {}
    for line in rows:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        out[cells[0]] = dict(zip(names, cells, strict=True))
    return out


# -------------------------------------------------------------------- list
def test_no_domains_yet_and_a_note_that_pacing_is_off(run: Run, zstore: Store) -> None:
    result = run("domains")
    assert result.exit_code == 0, result.output
    assert result.stdout == "no domains yet: none has pacing state, an override or jobs\n"
    assert result.stderr.startswith(PACING_OFF_NOTE)
    result = run("domains", "--json")
    assert (result.exit_code, json.loads(result.stdout)) == (0, [])


def test_set_writes_an_override_under_the_normalised_host(run: Run, zstore: Store) -> None:
    result = run("domains", "set", "Bücher.Example.", "--delay", "2.5", "--max-in-flight", "3")
    assert result.exit_code == 0, result.output
    assert PACING_OFF_NOTE in result.stderr  # overrides can wait for pacing to be on
    row = table(result)["xn--bcher-kva.example"]
    assert (row["DELAY NOW/CONF"], row["IN FLIGHT/CAP"], row["OVERRIDE"]) == (
        "2.5s/2.5s", "0/3", "yes")
    info = zstore.domain("xn--bcher-kva.example")
    assert (info.base_delay_s, info.max_in_flight, info.adaptive, info.overridden) == (
        2.5, 3, True, True)


def test_set_leaves_the_options_not_given_alone(run: Run, zstore: Store) -> None:
    run("domains", "set", "a.example", "--delay", "4")
    result = run("domains", "set", "a.example", "--max-in-flight", "0", "--no-adaptive")
    assert result.exit_code == 0, result.output
    assert table(result)["a.example"]["IN FLIGHT/CAP"] == "0/unlimited"
    info = zstore.domain("a.example")
    assert (info.base_delay_s, info.max_in_flight, info.adaptive) == (4.0, 0, False)
    assert table(run("domains"))["a.example"]["OVERRIDE"] == "yes, fixed"


def test_list_shows_every_domain_sorted_and_json_has_every_field(
        run: Run, zstore: Store) -> None:
    for host in ("b.example", "a.example", "[::1]"):
        assert run("domains", "set", host, "--delay", "1.5").exit_code == 0
    result = run("domains")
    assert list(table(result)) == ["::1", "a.example", "b.example"]
    shown = json.loads(run("domains", "--json").stdout)
    assert [d["name"] for d in shown] == ["::1", "a.example", "b.example"]
    assert shown[1] == {**zstore.domain("a.example").as_dict(), "now_ms": shown[1]["now_ms"],
                        "breaker_until": None, "closed_until": None, "last_429": None,
                        "plan": None}  # no jobs: nothing for the capacity planner


@pytest.mark.parametrize(("args", "message"), [
    (["bad host!", "--delay", "1"], "Invalid value for 'HOST': domain 'bad host!'"),
    (["", "--delay", "1"], "Invalid value for 'HOST': domain is empty"),
    (["a.example", "--delay", "-1"], "Invalid value for '--delay': must be a finite number"),
    (["a.example", "--delay", "nan"], "Invalid value for '--delay': must be a finite number"),
    (["a.example", "--delay", "inf"], "Invalid value for '--delay': must be a finite number"),
    (["a.example", "--delay", "soon"], "Invalid value for '--delay'"),
    (["a.example", "--max-in-flight", "-1"], "Invalid value for '--max-in-flight'"),
    (["a.example", "--max-in-flight", "2.5"], "Invalid value for '--max-in-flight'"),
    (["a.example"], "give at least one of --delay, --max-in-flight"),
])
def test_set_rejects_bad_input_naming_it_and_writes_nothing(
        run: Run, zstore: Store, args: list[str], message: str) -> None:
    before = domain_keys(zstore)
    result = run("domains", "set", *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert domain_keys(zstore) == before


def test_reset_drops_the_override(run: Run, zstore: Store) -> None:
    run("domains", "set", "a.example", "--delay", "9", "--no-adaptive")
    result = run("domains", "reset", "A.Example")
    assert (result.exit_code, result.stdout) == (0, "reset a.example\n")
    info = zstore.domain("a.example")
    assert (info.overridden, info.base_delay_s, info.adaptive) == (False, 1.0, True)
    assert run("domains", "reset", "a.example").stdout == "a.example: nothing to reset\n"
    result = run("domains", "reset", "bad host!")
    assert result.exit_code == 2 and "Invalid value for 'HOST'" in result.stderr


# ------------------------------------------------------- live pacing state
def test_a_retry_after_and_429s_show_in_the_listing_and_in_stats(
        run: Run, zstore: Store, pacing: dict[str, Any]) -> None:
    # One 429: two failures would open the breaker (it needs two requests here).
    settle_all(zstore, "slow.example", 1, "error", 429, retry_after_s=120)
    settle_all(zstore, "fine.example", 1, "complete", 200)
    result = run("domains")
    assert result.exit_code == 0, result.output
    assert PACING_OFF_NOTE not in result.stderr
    rows = table(result)
    slow, fine = rows["slow.example"], rows["fine.example"]
    assert slow["CLOSED UNTIL"].startswith("in ") and slow["CLOSED UNTIL"].endswith(("m", "s"))
    assert slow["LAST 429"].endswith(" ago") or slow["LAST 429"] == "now"
    assert (slow["429S"], slow["FAILED"], slow["COMPLETED"]) == ("1", "1", "0")
    assert slow["BREAKER"] == "closed"
    assert (fine["CLOSED UNTIL"], fine["LAST 429"], fine["COMPLETED"]) == ("-", "-", "1")
    assert fine["IN FLIGHT/CAP"] == "0/unlimited"

    shown = {d["name"]: d for d in json.loads(run("domains", "--json").stdout)}
    assert shown["slow.example"]["throttled"] is True
    assert shown["slow.example"]["closed_until"].endswith("Z")

    text = run("stats").stdout
    assert "throttled domains: slow.example\n" in text
    assert "fine.example" not in text
    counts = json.loads(run("stats", "--json").stdout)
    assert counts["domains_throttled"] == 1
    assert counts["domain_alerts"] == {"throttled": ["slow.example"], "breakers_open": []}


def test_an_open_breaker_shows_with_its_cool_down_and_reset_closes_it(
        run: Run, zstore: Store, pacing: dict[str, Any]) -> None:
    settle_all(zstore, "down.example", 3, "error", 500)
    row = table(run("domains"))["down.example"]
    assert row["BREAKER"].startswith("open, in ")
    assert "breakers open: down.example\n" in run("stats").stdout
    assert json.loads(run("stats", "--json").stdout)["breakers_open"] == 1

    assert run("domains", "reset", "down.example").stdout == "reset down.example\n"
    info = zstore.domain("down.example")
    assert (info.breaker, info.failed, info.completed) == ("closed", 0, 0)
    assert "breakers open" not in run("stats").stdout


def test_stats_lists_no_domains_while_pacing_is_off(run: Run, zstore: Store) -> None:
    run("domains", "set", "a.example", "--delay", "3")
    result = run("stats", "--json")
    assert result.exit_code == 0
    assert "domain_alerts" not in json.loads(result.stdout)
    assert "domains" not in run("stats").stdout


# ------------------------------------------------------------- Redis down
@pytest.mark.parametrize("args", [
    ["domains"], ["domains", "--json"], ["domains", "set", "a.example", "--delay", "1"],
    ["domains", "reset", "a.example"],
])
def test_unreachable_redis_is_a_clear_error_without_traceback(
        run: Run, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    monkeypatch.setenv("ZSCHED_REDIS_URL", UNREACHABLE)
    result = run(*args)
    assert result.exit_code == 69
    assert result.stderr.startswith("Error: cannot reach Redis at redis://127.0.0.1:1/0")
    assert "Traceback" not in result.output


def test_refresh_teaches_jobs_stored_before_pacing_their_domain(
        run: Run, make_store: Callable[..., Store], prefix: str, pacing: dict[str, Any]) -> None:
    plain = make_store(key_prefix=prefix)
    plain.upsert_many([Job.from_dict({"url": f"http://r.example/{i}", "interval_s": 60})
                       for i in range(3)], stagger=False)
    result = run("domains", "refresh")
    assert (result.exit_code, result.stdout) == (0, "refreshed 3 jobs\n"), result.output
    states = plain.states([job.id for job in plain.iter_jobs()])
    assert {s.domain for s in states if s is not None} == {"r.example"}
