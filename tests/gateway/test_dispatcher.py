"""The dispatcher alone (no HTTP): jobs claimed for polls that are gone go back, and
``zsched serve`` refuses a port in use with one line."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator

import pytest

from celery_zsched.config import Settings, api_token_scopes
from celery_zsched.core.errors import ConfigurationError
from celery_zsched.server.dispatcher import Dispatcher, ShuttingDown
from celery_zsched.store import Store
from tests.cli_env import cli_prefix, invoke
from tests.gateway.conftest import LEASE_SECRET, TOKENS, http_job


def test_a_job_claimed_for_a_poll_that_left_meanwhile_goes_back(
        make_store: Callable[..., Store]) -> None:
    store = make_store()
    store.upsert(http_job("raced"))
    due = store.client.zscore(store.keys.http_schedule, "raced")

    async def scenario() -> int:
        dispatcher = Dispatcher(store)
        waiter = dispatcher.enter("")
        batch = store.claim_http(1)  # the claim is under way ...
        assert dispatcher.withdraw(waiter) == []  # ... when the poll times out
        left = dispatcher._hand_out("", batch.jobs)
        dispatcher.give_back(left)
        await dispatcher.close()
        return dispatcher.released

    assert asyncio.run(scenario()) == 1
    assert store.client.zscore(store.keys.http_schedule, "raced") == due
    state = store.states(["raced"])[0]
    assert state is not None and state.status == "scheduled" and state.publishes == 0


def test_shutting_down_answers_waiting_polls_and_refuses_new_ones(
        make_store: Callable[..., Store]) -> None:
    store = make_store()

    async def scenario() -> None:
        dispatcher = Dispatcher(store)
        dispatcher.start()
        waiter = dispatcher.enter("eu")
        await dispatcher.close()
        with pytest.raises(ShuttingDown):
            dispatcher.withdraw(waiter)
        with pytest.raises(ShuttingDown):
            dispatcher.enter("eu")

    asyncio.run(scenario())


@pytest.fixture
def prefix(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from cli_prefix(redis_url, monkeypatch, "serve", api_tokens=TOKENS,
                          gateway_lease_secret=LEASE_SECRET)


def test_zsched_serve_refuses_a_port_in_use_in_one_line(prefix: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = invoke("serve", "--port", str(port))
    assert res.exit_code != 0
    assert f"cannot listen on 127.0.0.1:{port}" in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize(("raw", "words"), [
    ("short:worker", "entry 1: a token must be at least 16"),
    ("a-long-enough-token-1:worker, a-long-enough-token-2:admin", "entry 2 must be token:scope"),
    ("no-scope-at-all-here-123", "entry 1 must be token:scope"),
    ("gateway_timeout_s", None),
])
def test_bad_api_tokens_and_gateway_settings_are_refused_naming_them(
        raw: str, words: str | None) -> None:
    if words is None:
        with pytest.raises(ConfigurationError, match="zsched_gateway_timeout_s must be > 0"):
            Settings.from_mapping({"zsched_gateway_timeout_s": 0}, env={})
        with pytest.raises(ConfigurationError, match="zsched_gateway_lease_s must be > 0"):
            Settings.from_mapping({"zsched_gateway_lease_s": -1}, env={})
        return
    with pytest.raises(ConfigurationError, match="zsched_api_tokens") as info:
        Settings.from_mapping({"zsched_api_tokens": raw}, env={})
    assert words in str(info.value)


def test_tokens_map_to_their_scopes() -> None:
    scopes = api_token_scopes(" a-long-enough-token:with:colons:Worker ,, r" + "x" * 20 + ":read")
    assert scopes == {"a-long-enough-token:with:colons": "worker", "r" + "x" * 20: "read"}
