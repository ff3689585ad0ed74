"""The runtime state of a job: one typed class over the compact encoding the scripts write.

Redis keeps one small JSON object per job (the ``state`` hash) with one- and
two-letter keys, because a fleet has millions of them: the short keys save
about 160 bytes a job in Redis against readable names (1.6 GB at ten million
jobs; ``tests/test_state.py`` measures it). :class:`RuntimeState` is the one
place those letters are known on the Python side; the Lua side shares them
through ``lua/_prelude.lua``. Adding a field means a line here and the scripts
that write it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any


def _wire(name: str, doc: str) -> dict[str, str]:
    return {"wire": name, "doc": doc}


@dataclass(frozen=True)
class RuntimeState:
    """Where one job stands: its current occurrence, attempt, counts and last outcome."""

    status: str = field(default="scheduled", metadata=_wire(
        "s", "scheduled | queued | running | paused | dead | finished "
             "(leased: a 0.1 store's queued)"))
    occurrence: int = field(default=0, metadata=_wire(
        "o", "the current occurrence, named by its first due time (epoch ms)"))
    attempt: int = field(default=1, metadata=_wire(
        "a", "attempt number of the current occurrence (retries count up from 1)"))
    crashes: int = field(default=0, metadata=_wire(
        "d", "executions of this attempt whose worker died (execution lease ran out)"))
    publishes: int = field(default=0, metadata=_wire(
        "x", "messages published for this attempt (1 = first; more after a crash or a loss)"))
    due_ms: int | None = field(default=None, metadata=_wire(
        "due", "due time of the attempt last promoted (epoch ms)"))
    promoted_ms: int | None = field(default=None, metadata=_wire(
        "p", "when beat published it, on Redis' clock (expires_s counts from here)"))
    started_ms: int | None = field(default=None, metadata=_wire(
        "sa", "when a worker started it, on Redis' clock"))
    next_due_ms: int | None = field(default=None, metadata=_wire(
        "n", "next due time set by the last settle"))
    runs: int = field(default=0, metadata=_wire(
        "r", "runs that counted toward max_runs (completions and final errors)"))
    failures: int = field(default=0, metadata=_wire("f", "errors, all time"))
    consecutive_failures: int = field(default=0, metadata=_wire(
        "c", "errors since the last success"))
    last_error: str | None = field(default=None, metadata=_wire("e", "the last error text"))
    last_outcome: str | None = field(default=None, metadata=_wire(
        "ls", "complete | retrying | error | skipped | blocked_by_robots, of the last settle"))
    last_settled_ms: int | None = field(default=None, metadata=_wire(
        "l", "when the last settle happened, on Redis' clock (the job's last run)"))
    timing_signature: str | None = field(default=None, metadata=_wire(
        "g", "signature of the timing the schedule was computed from"))
    queue: str | None = field(default=None, metadata=_wire(
        "q", "the queue beat routed the published message to, once the publish is "
             'confirmed ("": a queue the router did not name; absent: not confirmed)'))
    priority: int | None = field(default=None, metadata=_wire(
        "pr", "the priority the confirmed message was published with (absent: none): "
              "with its queue, the broker list it waits in"))
    domain: str | None = field(default=None, metadata=_wire(
        "dm", "the domain the job is paced under (pacing on, and it has one)"))
    flight_domain: str | None = field(default=None, metadata=_wire(
        "fd", "the domain whose in-flight count this occurrence holds, until it lands"))
    reserved_ms: int | None = field(default=None, metadata=_wire(
        "rv", "the domain slot pacing held the job back to (its due time while it waits)"))
    transport: str | None = field(default=None, metadata=_wire(
        "t", '"h": a transport http job, waiting in the HTTP schedule (absent: celery)'))
    fence: int = field(default=0, metadata=_wire(
        "k", "hand-outs to an executor, all time: every start and every gateway claim "
             "numbers its holder so; heartbeat, settle and retry present it (fencing)"))
    holder: str | None = field(default=None, metadata=_wire(
        "w", "the worker that received the queued message and holds it, unstarted "
             "(its heartbeat keeps the hold; when it stops, the reaper republishes)"))
    task: str | None = field(default=None, metadata=_wire(
        "tk", "the task name the queued message was published under (start refuses "
              "another)"))
    queue_bucket: str | None = field(default=None, metadata=_wire(
        "bq", "the queue whose backpressure count a claim put this occurrence in (the "
              "job's queue field; \"\": none); it leaves that count when it leaves queued"))
    visits: float | None = field(default=None, metadata=_wire(
        "hv", "visits that reported whether the page changed, exponentially decayed "
              "(core.recrawl)"))
    changes: float | None = field(default=None, metadata=_wire(
        "hx", "of those visits, the ones that saw a change (decayed alike)"))
    covered_s: float | None = field(default=None, metadata=_wire(
        "ht", "seconds those visits covered, each since the visit before it (decayed alike)"))
    watched_s: float | None = field(default=None, metadata=_wire(
        "hm", "seconds those visits watched the page unchanged: a visit that saw a "
              "change the page dated (Last-Modified) counts from that change, any other "
              "its whole gap (decayed alike)"))
    undated: float | None = field(default=None, metadata=_wire(
        "hu", "of the visits that saw a change, the ones the page did not date within "
              "their gap (decayed alike): while any count, the rate is Cho's estimate "
              "from change or no change alone"))
    last_visit_ms: int | None = field(default=None, metadata=_wire(
        "hl", "when the last visit that reported a change or not settled (Redis' clock)"))
    last_change_ms: int | None = field(default=None, metadata=_wire(
        "hc", "when a visit last saw a change (Redis' clock)"))
    recrawl_interval_ms: int | None = field(default=None, metadata=_wire(
        "ri", "the interval an adaptive job's last regular settle chose (ms)"))
    etag: str | None = field(default=None, metadata=_wire(
        "et", "the ETag the last visit reported (for If-None-Match)"))
    last_modified: str | None = field(default=None, metadata=_wire(
        "lm", "the Last-Modified the last visit reported (for If-Modified-Since)"))
    signature: str | None = field(default=None, metadata=_wire(
        "sg", "the content signature the last visit reported (a hash): the next one "
              "that differs is a change"))
    version: int | None = field(default=None, metadata=_wire(
        "v", "version of the last versioned write (the Django outbox): an older one is "
             "refused (absent: never written with one)"))

    @classmethod
    def from_wire(cls, raw: str | bytes | Mapping[str, Any] | None) -> RuntimeState:
        """Decode what the scripts stored (``None``: a job with no state yet).

        Unknown keys are ignored, so an older reader survives a newer writer.
        """
        if raw is None:
            return cls()
        data = json.loads(raw) if isinstance(raw, str | bytes) else raw
        values = {name: data[wire] for wire, name in _FROM_WIRE.items() if wire in data}
        return cls(**{k: _coerce(k, v) for k, v in values.items()})

    def to_wire(self) -> dict[str, Any]:
        """The compact mapping the scripts read (unset optional fields left out)."""
        return {_TO_WIRE[f.name]: value for f in fields(self)
                if (value := getattr(self, f.name)) is not None}

    def to_dict(self) -> dict[str, Any]:
        """Readable field names and values (``zsched show``)."""
        return dataclasses.asdict(self)

    @classmethod
    def describe(cls) -> list[tuple[str, str, str]]:
        """(name, wire key, meaning) of every field, for documentation."""
        return [(f.name, f.metadata["wire"], f.metadata["doc"]) for f in fields(cls)]


_TO_WIRE: dict[str, str] = {f.name: f.metadata["wire"] for f in fields(RuntimeState)}
_FROM_WIRE: dict[str, str] = {wire: name for name, wire in _TO_WIRE.items()}
_INTS = {f.name for f in fields(RuntimeState) if f.type in ("int", "int | None")}


def _coerce(name: str, value: Any) -> Any:
    # cjson writes every number as a float-capable double: 3 may come back as 3.0.
    if name in _INTS and isinstance(value, float):
        return int(value)
    return value
