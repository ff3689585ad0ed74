"""RuntimeState is the one typed view of the state the Lua scripts write."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from importlib import resources

import redis

from celery_zsched.core.job import Job
from celery_zsched.core.state import RuntimeState
from celery_zsched.store import Store
from tests.docs_pages import page


def test_every_key_the_scripts_write_is_a_named_field() -> None:
    """Each ``st.<key>`` any script assigns or reads is declared in RuntimeState."""
    wire = {f.metadata["wire"] for f in fields(RuntimeState)}
    lua = resources.files("celery_zsched.store").joinpath("lua")
    used: set[str] = set()
    for script in lua.iterdir():
        if script.name.endswith(".lua"):
            used |= set(re.findall(r"\bst\.(\w+)", script.read_text("utf-8")))
    prelude = lua.joinpath("_prelude.lua").read_text("utf-8")
    used |= set(re.findall(r"\b(\w+) = ", prelude.split("new_state")[1].split("end")[0]))
    assert used <= wire, used - wire


def test_state_of_a_settled_job_reads_back_with_names_and_types(store: Store) -> None:
    """What claim, start and settle write decodes to typed fields; the encoding round-trips."""
    job = Job.from_dict({"id": "s1", "task": "t", "interval_s": 60, "jitter_s": 0})
    store.upsert(job)
    claimed = store.claim().jobs[0]
    started = store.start("s1", claimed.occurrence, claimed.attempt)
    res = store.settle("s1", claimed.occurrence, claimed.attempt, "error", error="boom")
    raw = store.client.hget(store.keys.state, "s1")
    state = RuntimeState.from_wire(raw)
    assert state == store.get("s1").state
    assert (state.status, state.attempt, state.failures, state.consecutive_failures) == (
        "scheduled", 2, 1, 1)
    assert (state.last_error, state.last_outcome, state.last_settled_ms) == (
        "boom", "retrying", res.now_ms)
    assert state.started_ms == started.now_ms and state.promoted_ms == claimed.promoted_ms
    assert isinstance(state.occurrence, int) and state.timing_signature == job.timing_signature
    assert RuntimeState.from_wire(json.dumps(state.to_wire())) == state
    assert RuntimeState.from_wire({**state.to_wire(), "zz": 1}) == state  # newer writer
    assert RuntimeState.from_wire(None) == RuntimeState()


def test_the_compact_encoding_saves_memory_per_job(rclient: redis.Redis) -> None:
    """Measured: readable key names would cost about 160 bytes more per job in Redis."""
    state = RuntimeState(status="scheduled", occurrence=1_795_463_601_436, attempt=1,
                         due_ms=1_795_463_601_436, promoted_ms=1_795_463_601_500,
                         started_ms=1_795_463_601_510, runs=12, failures=1,
                         last_outcome="complete", last_settled_ms=1_795_463_601_900,
                         next_due_ms=1_795_463_901_900, timing_signature="2dc292e4f2",
                         publishes=1)
    compact = json.dumps(state.to_wire(), separators=(",", ":"))
    readable = json.dumps({k: v for k, v in state.to_dict().items() if v is not None},
                          separators=(",", ":"))
    n = 2000
    rclient.hset("t:compact", mapping={f"job{i:06d}": compact for i in range(n)})
    rclient.hset("t:readable", mapping={f"job{i:06d}": readable for i in range(n)})
    per_job = ((rclient.memory_usage("t:readable") or 0)
               - (rclient.memory_usage("t:compact") or 0)) / n
    print(f"compact {len(compact)} B, readable {len(readable)} B, saving {per_job:.0f} B/job")
    assert per_job >= 80


def test_the_redis_layout_page_documents_every_state_field_by_name() -> None:
    """The Redis layout page (generated from ``RuntimeState``) lists each field with its
    wire key."""
    layout = page("reference/redis-layout.md")
    missing = [name for name, wire, _doc in RuntimeState.describe()
               if f"| `{name}` | `{wire}` |" not in layout]
    assert missing == []
