"""Fencing at the job gateway, with the default lease, and poison telemetry refused (issue 18).

A real ``zsched serve`` process on the throwaway Redis, every setting at its
default (the gateway lease is 60 s). Worker A takes a job and goes silent; the
server's reaper brings the job back one lease later, and worker B takes it.
A's lease token names its hand-out (fence 1), B's the next one (fence 2):

* A's report after the reap and before B's claim gets ``409``;
* after B's claim, A's heartbeat and A's error report get ``409`` and change
  nothing;
* B's report applies.

And a report whose echoed times are not epoch ms on Redis' clock (a careless
worker's microseconds, a hostile ``10**30``) gets ``400`` naming the field.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from celery_zsched.core.state import RuntimeState
from celery_zsched.store import Store
from gateway.conftest import TOKENS, WORKER, http_job, serve_process, stop_process
from tests.helpers import free_port, store_snapshot, wait

pytestmark = pytest.mark.slow


@pytest.fixture
def gateway(store: Store, redis_url: str) -> Iterator[tuple[Store, httpx.Client]]:
    """``zsched serve`` with the default settings (but the tokens) on the test's store."""
    assert TOKENS
    port = free_port()
    proc = serve_process(redis_url, store.settings.key_prefix, port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                          headers={"Authorization": f"Bearer {WORKER}"}) as client:
            yield store, client
    finally:
        stop_process(proc)


def _take(client: httpx.Client) -> dict[str, Any]:
    res = client.get("/jobs/next", params={"timeout": 0})
    assert res.status_code == 200, res.text
    job: dict[str, Any] = res.json()
    return job


def _echo(job: dict[str, Any]) -> dict[str, Any]:
    return {k: job[k] for k in ("lease", "scheduled_at", "picked_up_at")}


def _state(store: Store, job_id: str) -> RuntimeState:
    return RuntimeState.from_wire(store.client.hget(store.keys.state, job_id))


def test_a_holder_whose_lease_lapsed_changes_nothing_once_it_was_reaped_or_handed_out_again(
        gateway: tuple[Store, httpx.Client]) -> None:
    store, client = gateway
    lease_s = store.settings.gateway_lease_s
    assert lease_s == 60.0  # the default
    store.upsert(http_job("zombie"))
    a = _take(client)
    assert a["deliveries"] == 1 and a["lease"].count(".") == 3
    wait(lambda: _state(store, "zombie").crashes == 1, lease_s + 30,
         "the server's reaper to end A's lease")
    # Reaped, not claimed again yet: A's report is stale and changes nothing.
    before = store_snapshot(store)
    late = client.post("/jobs/zombie/complete", json=_echo(a))
    assert late.status_code == 409 and late.json()["reason"] == "stale"
    assert store_snapshot(store)["state"] == before["state"]
    b = _take(client)
    assert (b["occurrence"], b["attempt"], b["deliveries"]) == (a["occurrence"], 1, 2)
    assert b["lease"] != a["lease"]
    lease_b = store.client.zscore(store.keys.leases, "zombie")
    before = store_snapshot(store)
    beat = client.post("/jobs/zombie/heartbeat", json={"lease": a["lease"]})
    assert beat.status_code == 409 and beat.json()["extended"] is False
    error = client.post("/jobs/zombie/error", json={**_echo(a), "error": "late"})
    assert error.status_code == 409 and error.json()["applied"] is False
    after = store_snapshot(store)
    assert (after["state"], after["leases"], after["events"]) == (
        before["state"], before["leases"], before["events"])
    assert store.client.zscore(store.keys.leases, "zombie") == lease_b
    done = client.post("/jobs/zombie/complete", json=_echo(b))
    assert done.status_code == 200 and done.json()["applied"] is True
    assert _state(store, "zombie").runs == 1


#: Echoed times that are not epoch ms: 10**30, microseconds, seconds, negative.
POISON = [("scheduled_at", 10**30), ("picked_up_at", 10**30),
          ("scheduled_at", 1_795_488_021_269_000), ("picked_up_at", 1_795_488_021_269_000),
          ("picked_up_at", 1_795_488_021), ("scheduled_at", -1)]


def test_a_report_with_times_that_are_not_epoch_ms_is_refused_naming_the_field(
        gateway: tuple[Store, httpx.Client]) -> None:
    store, client = gateway
    for n, (field, value) in enumerate(POISON):
        job_id = f"poison-{n}"
        store.upsert(http_job(job_id))
        job = _take(client)
        assert job["id"] == job_id
        before = store_snapshot(store)
        res = client.post(f"/jobs/{job_id}/complete", json={**_echo(job), field: value})
        assert res.status_code == 400 and res.json()["field"] == field, res.text
        assert store_snapshot(store) == before
        ok = client.post(f"/jobs/{job_id}/complete", json=_echo(job))
        assert ok.status_code == 200
