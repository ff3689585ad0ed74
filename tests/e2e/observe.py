"""What the end-to-end scenarios read back from a deployment, and how they report it.

The long scenarios take an issue's full sizes with ``ZSCHED_SOAK=1``; by
default a short variant of each runs, as in CI, with the same (default)
timeouts. Every scenario prints its counts as one ``contract {json}`` line
(``pytest -s`` shows it) and records it as the test's ``contract`` property.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest

from celery_zsched.core.results import task_id_for
from celery_zsched.core.state import RuntimeState
from e2e.conftest import Deployment, Proc, wait_for

T = TypeVar("T")
#: ``ZSCHED_SOAK=1`` selects the issue's full sizes (minutes); else CI's short variant.
SOAK = os.environ.get("ZSCHED_SOAK") == "1"
VARIANT = "long" if SOAK else "short"


def report(request: pytest.FixtureRequest, scenario: str, **counts: Any) -> None:
    """Print the scenario's counts as one line and record them on the test."""
    line = json.dumps({"scenario": scenario, "variant": VARIANT, **counts})
    print(f"\ncontract {line}")
    request.node.user_properties.append(("contract", line))


@contextmanager
def sampling(probe: Callable[[], T], interval: float) -> Iterator[list[T]]:
    """Call ``probe`` every ``interval`` s in a thread; yield the list of its values so far."""
    samples: list[T] = []
    errors: list[Exception] = []
    stop = threading.Event()

    def loop() -> None:
        while True:
            try:
                samples.append(probe())
            except Exception as exc:  # re-raised in the test's thread
                errors.append(exc)
                return
            if stop.wait(interval):
                return

    thread = threading.Thread(target=loop, name="e2e-sampler", daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(10)
    if errors:
        raise errors[0]


def states(d: Deployment) -> dict[str, RuntimeState]:
    """Every job's runtime state."""
    return {job_id: RuntimeState.from_wire(raw)
            for job_id, raw in d.store.client.hgetall(d.store.keys.state).items()}


def stuck_report(d: Deployment, ids: list[str], since_ms: int) -> str:
    """What a wait for every job to settle after ``since_ms`` found stuck, for its failure:
    the jobs not dead and not settled since, and the queued set's first deadlines."""
    stuck = {job_id: st for job_id, st in states(d).items()
             if job_id in ids and st.status != "dead" and (st.last_settled_ms or 0) <= since_ms}
    deadlines = d.store.client.zrange(d.store.keys.queued, 0, 4, withscores=True)
    return (f"{len(stuck)} parked, e.g. {list(stuck.items())[:3]}; first deadlines "
            f"{deadlines}, now {d.store.now_ms()}; {_broker_holds(d, list(stuck)[:3])}; "
            f"{_logged(d, dict(list(stuck.items())[:3]))}")


def _logged(d: Deployment, stuck: dict[str, RuntimeState]) -> str:
    """Which processes' logs name each stuck occurrence's task id (received, started)."""
    found: dict[str, list[str]] = {}
    for job_id, st in stuck.items():
        task_id = task_id_for(job_id, st.occurrence or 0, st.attempt or 1)
        found[job_id] = [f"{proc.name}: {line.strip()[:160]}" for proc in d.procs
                         for line in proc.text().splitlines() if task_id in line]
    return f"logs naming their task ids {found}"


def _broker_holds(d: Deployment, ids: list[str]) -> str:
    """Where a Redis broker has the messages of ``ids``: its queue, its unacked hash."""
    if d.broker is None or not ids:
        return "broker not read"
    waiting = [raw for raw in d.broker.lrange(d.queue, 0, -1)]
    unacked = list(d.broker.hvals("unacked"))
    found = {job_id: (sum(job_id in str(raw) for raw in waiting),
                      sum(job_id in str(raw) for raw in unacked)) for job_id in ids}
    return (f"broker (in queue, unacked) per job {found}, queue length {len(waiting)}, "
            f"unacked {len(unacked)}")


def counters(d: Deployment) -> Counter[str]:
    """The store's lifetime counters (promoted, started, duplicates, lost, dead, ...)."""
    raw = d.store.client.hgetall(d.store.keys.counters)
    return Counter({name: int(value) for name, value in raw.items()})


def settles(d: Deployment) -> list[dict[str, str]]:
    """Every settle event in the store's stream, oldest first."""
    out: list[dict[str, str]] = []
    after = "0"
    while page := d.store.events(after):
        out += [fields for _id, fields in page]
        after = page[-1][0]
    return out


def wait_all(d: Deployment, ids: list[str], predicate: Callable[[RuntimeState], bool],
             timeout: float, what: str) -> dict[str, RuntimeState]:
    """Poll every job's state until ``predicate`` holds for each one; return them."""
    def check() -> dict[str, RuntimeState] | None:
        now = states(d)
        return now if all(predicate(now.get(job_id, RuntimeState())) for job_id in ids) \
            else None
    # At a pace that suits a read of every job's state.
    return wait_for(check, timeout, what, interval=0.25, check=d.check_alive)


def wait_redis_ms(d: Deployment, until_ms: int, what: str) -> None:
    """Sleep until the Redis clock reads ``until_ms``, failing early if a process died."""
    d.wait_for(lambda: d.store.now_ms() >= until_ms, (until_ms - d.store.now_ms()) / 1000 + 10,
               what)


def wait_ready(d: Deployment, worker: Proc) -> None:
    """Wait until the worker consumes."""
    d.wait_for(lambda: " ready." in worker.text(), 60, f"{worker.name} to be ready")
