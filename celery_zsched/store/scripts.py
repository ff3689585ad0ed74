"""The Lua scripts: each one's keys, arguments and reply, declared once.

A :class:`ScriptSpec` names, in order, the :class:`~celery_zsched.store.keys.Keys`
a script takes as KEYS, the named values it takes as ARGV, the repeated group
that may follow them, and the parser that turns its reply into a typed result.
:class:`~celery_zsched.store.Store` calls scripts only through these specs, with
keyword arguments, so no caller builds KEYS or counts strides by hand. Each
``.lua`` file documents the same KEYS and ARGV in its header (a test checks
that the two agree) and is loaded with the shared ``_prelude.lua`` in front.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Generic, TypeVar

from celery_zsched.core.job import Job
from celery_zsched.core.results import ClaimBatch, Claimed, NoticeGate, ReapResult, StartResult
from celery_zsched.store.keys import Keys

R = TypeVar("R")
_PRELUDE = "_prelude"


def source(name: str) -> str:
    """The Lua source of script ``name`` as Redis runs it: the prelude, then the file."""
    lua = resources.files("celery_zsched.store").joinpath("lua")
    return (lua.joinpath(f"{_PRELUDE}.lua").read_text("utf-8") + "\n"
            + lua.joinpath(f"{name}.lua").read_text("utf-8"))


def _as_is(reply: Any) -> Any:
    return reply


@functools.lru_cache(maxsize=256)
def _key_names(names: tuple[str, ...], keys: Keys) -> tuple[str, ...]:
    # Cached: Keys builds each name on every read, and a worker asks for the same
    # script's keys in the same partition once or twice an execution.
    return tuple(getattr(keys, name) for name in names)


@dataclass(frozen=True)
class ScriptSpec(Generic[R]):
    """One Lua script's contract: KEYS by name, ARGV by name, and its reply type."""

    name: str
    #: Attribute names of :class:`Keys`, in KEYS order.
    keys: tuple[str, ...]
    #: Names of the ARGV values, in order.
    args: tuple[str, ...] = ()
    #: Names of the values of one repeated group that follows ``args`` (0..n times).
    group: tuple[str, ...] = ()
    reply: Callable[[Any], R] = field(default=_as_is)

    def key_names(self, keys: Keys) -> list[str]:
        """The KEYS of this script in the store with ``keys``."""
        return list(_key_names(self.keys, keys))

    @functools.cached_property
    def _arg_set(self) -> frozenset[str]:
        return frozenset(self.args)

    def argv(self, values: Mapping[str, Any], rows: Iterable[Sequence[Any]] = ()) -> list[Any]:
        """ARGV from named ``values`` plus ``rows`` of the repeated group.

        Raises ``TypeError`` for a missing or unknown name, or a row of the wrong
        size: a caller and a script can never disagree silently.
        """
        if values.keys() != self._arg_set:
            missing, extra = set(self.args) - set(values), set(values) - set(self.args)
            raise TypeError(f"{self.name}.lua: missing {sorted(missing)}, unknown {sorted(extra)}")
        out = [values[name] for name in self.args]
        for row in rows:
            if len(row) != len(self.group):
                raise TypeError(f"{self.name}.lua: a row is {self.group}, got {len(row)} values")
            out.extend(row)
        return out


# ------------------------------------------------------------------ replies
def _claim_reply(res: Sequence[Any]) -> ClaimBatch:
    now, next_due, next_deadline, room, held, queue_held = (int(x) for x in res[:6])
    jobs = [Claimed(Job.from_json(res[i + 1]), int(res[i + 2]), int(res[i + 3]),
                    int(res[i + 4]), int(res[i + 5]), now, int(res[i + 6]),
                    validators=_validators(res[i + 7]))
            for i in range(6, len(res), 8)]
    return ClaimBatch(now, next_due if next_due >= 0 else None,
                      next_deadline if next_deadline >= 0 else None, jobs, room, held,
                      queue_held)


def _validators(raw: Any) -> dict[str, str]:
    if not raw:
        return {}
    stored = json.loads(raw)
    return {name: stored[wire] for name, wire in
            (("etag", "et"), ("last_modified", "lm"), ("signature", "sg")) if wire in stored}


def _start_reply(res: Sequence[Any]) -> StartResult:
    status = str(res[0])
    if status == "ok":
        return StartResult(status, int(res[1]), int(res[2]), int(res[3]), fence=int(res[4]),
                           definition=str(res[5]) or None)
    if status == "expired":
        return StartResult(status, int(res[1]), None, int(res[2]))
    if status in ("wait", "deferred"):
        # wait: ms until the domain's gate opens; deferred: the time it went back to.
        return StartResult(status, found=str(res[1]), until_ms=int(res[1]))
    if status == "refused":
        return StartResult(status, found=str(res[2]), reason=str(res[1]))
    return StartResult(status, found=str(res[1]) if len(res) > 1 else "")


def _reap_reply(res: Sequence[Any]) -> ReapResult:
    redelivered, dead, lost, held, converted, orphaned, unpublished = (
        int(n) for n in res[:7])
    ids = tuple(str(i) for i in res[7:])
    # The dead-lettered ids come last.
    return ReapResult(redelivered, dead, lost, held, converted, orphaned, unpublished, ids=ids,
                      dead_ids=ids[len(ids) - dead:] if dead else ())


def _names(res: Sequence[Any]) -> list[str]:
    return [str(i) for i in res]


def _gone(res: Sequence[Any]) -> list[tuple[str, str]]:
    """heartbeat.lua's rows no longer running or held, as (kind, id)."""
    return [(str(res[i]), str(res[i + 1])) for i in range(0, len(res), 2)]


def _counts(res: Sequence[Any]) -> tuple[int, ...]:
    return tuple(int(n) for n in res)


@dataclass(frozen=True)
class ControlReply:
    """control.lua's answer: jobs changed, versioned rows refused as stale, ids not found."""

    changed: int = 0
    stale: int = 0
    missing: tuple[str, ...] = ()


def _control_reply(res: Sequence[Any]) -> ControlReply:
    return ControlReply(int(res[0]), int(res[1]), tuple(str(i) for i in res[2:]))


@dataclass(frozen=True)
class SettleReply:
    """settle.lua's verdict (``ok`` | ``stale`` | ``changed`` | ``deleted``) and what it did."""

    verdict: str
    status: str | None = None
    now_ms: int | None = None
    consecutive_failures: int = 0
    #: The domain whose breaker this settle opened, or None.
    breaker_opened: str | None = None
    #: The next due time it set (None: the job ended).
    next_due_ms: int | None = None


def _settle_reply(res: Sequence[Any]) -> SettleReply:
    if res[0] == "ok":
        next_due = int(res[5])
        return SettleReply("ok", str(res[1]), int(res[2]), int(res[3]), str(res[4]) or None,
                           next_due if next_due >= 0 else None)
    if res[0] == "deleted":
        return SettleReply("deleted", breaker_opened=str(res[1]) or None)
    return SettleReply(str(res[0]))


def _notice_reply(res: Sequence[Any]) -> NoticeGate:
    digest = json.loads(res[3]) if res[3] else None
    if digest is not None:
        # cjson writes an empty table as an object.
        digest["notices"] = [json.loads(n) for n in digest.get("notices") or []]
        digest["by_event"] = dict(digest.get("by_event") or {})
    return NoticeGate(str(res[0]), int(res[1]) or None, int(res[2]), digest)


# ---------------------------------------------------------------- the scripts
#: What a mutating script needs to record a change (see :func:`.audit.audit_args`).
AUDIT_ARGS = ("audit_maxlen", "actor_kind", "actor_name", "note")
UPSERT = ScriptSpec(
    "upsert", ("defs", "schedule", "leases", "state", "paused", "static", "queued", "audit",
               "http_schedule", "http_wake", "tombstones", "tombstone_expiry"),
    args=("static", *AUDIT_ARGS),
    group=("id", "definition", "due_ms", "enabled", "signature", "gap_ms", "domain",
           "transport", "expect", "version"),
    reply=_counts)
CLAIM = ScriptSpec(
    "claim", ("schedule", "queued", "leases", "state", "defs", "counters", "domains",
              "domain_conf", "queue_in_flight", "queue_held"),
    args=("limit", "deadline_ms", "bound", "pacing", "status", "queue", "queue_bound"),
    reply=_claim_reply)
#: The job gateway's claim: the same script, from the HTTP schedule straight
#: into running under an execution lease (``deadline_ms`` is the lease).
CLAIM_HTTP = ScriptSpec(
    "claim", ("http_schedule", "leases", "leases", "state", "defs", "counters", "domains",
              "domain_conf", "queue_in_flight", "queue_held"),
    args=CLAIM.args, reply=_claim_reply)
START = ScriptSpec(
    "start", ("state", "queued", "leases", "schedule", "counters", "domains", "domain_conf",
              "http_schedule", "http_wake", "defs", "queue_in_flight", "received"),
    args=("id", "occurrence", "attempt", "delivery", "task", "lease_ms", "expires_ms",
          "pacing", "wait_max_ms"),
    reply=_start_reply)
HEARTBEAT = ScriptSpec(
    "heartbeat", ("leases", "state", "workers", "queued"),
    args=("lease_ms", "worker", "queues"),
    group=("kind", "id", "occurrence", "attempt", "number", "task"), reply=_gone)
ROUTED = ScriptSpec(
    "routed", ("state", "queued"), args=("delivery_ms",),
    group=("id", "occurrence", "attempt", "delivery", "queue", "task", "priority"),
    reply=int)
RETRYING = ScriptSpec(
    "retrying", ("leases", "queued", "state", "queue_in_flight"),
    args=("id", "occurrence", "attempt", "deadline_ms", "countdown_ms", "fence"), reply=bool)
SETTLE = ScriptSpec(
    "settle", ("schedule", "leases", "state", "defs", "paused", "events", "counters", "queued",
               "domains", "domain_conf", "http_schedule", "http_wake", "queue_in_flight",
               "recrawl_mu"),
    args=("id", "occurrence", "attempt", "outcome", "label", "next_due_ms", "next_occurrence",
          "next_attempt", "error", "signature", "max_runs", "events_maxlen", "event",
          "http_status", "retry_after_ms", "pacing", "fence", "delivery", "clock_ms", "end_ms",
          "changed", "content_signature", "etag", "last_modified", "recrawl", "modified_ms"),
    reply=_settle_reply)
REAP = ScriptSpec(
    "reap", ("leases", "queued", "schedule", "state", "dead", "defs", "counters", "workers",
             "domains", "http_schedule", "http_wake", "queue_in_flight"),
    args=("limit", "max_deliveries", "delivery_ms", "alive_ms"), reply=_reap_reply)
RESCUE = ScriptSpec(
    "rescue", ("state", "queued", "schedule", "counters", "domains", "http_schedule",
               "http_wake", "queue_in_flight"),
    group=("id", "occurrence", "attempt", "delivery"), reply=_names)
LOST = ScriptSpec(
    "lost", ("state", "queued", "schedule", "counters", "domains", "http_schedule",
             "http_wake", "queue_in_flight"),
    args=("limit", "deadline_max_ms", "slack_ms", "near_ms"), group=("line", "mark"),
    reply=_names)
RELEASE = ScriptSpec(
    "release", ("queued", "schedule", "state", "domains", "http_schedule", "http_wake",
                "queue_in_flight"),
    args=("status",), group=("id", "occurrence", "attempt"), reply=int)
#: The job gateway's release: jobs it claimed (running) for pollers that went away.
RELEASE_HTTP = ScriptSpec(
    "release", ("leases", "schedule", "state", "domains", "http_schedule", "http_wake",
                "queue_in_flight"),
    args=("status",), group=("id", "occurrence", "attempt"), reply=int)
CONTROL = ScriptSpec(
    "control", ("defs", "schedule", "leases", "state", "paused", "dead", "static", "queued",
                "audit", "http_schedule", "http_wake", "tombstones", "tombstone_expiry"),
    args=("operation", *AUDIT_ARGS, "tombstone_ms"), group=("id", "due_ms", "version"),
    reply=_control_reply)
#: Moving whole jobs between partitions online (see relocate.lua).
RELOCATE = ScriptSpec(
    "relocate", ("defs", "state", "schedule", "http_schedule", "queued", "leases", "paused",
                 "static", "dead", "moving", "http_wake"),
    args=("operation",), group=("id", "to", "record"), reply=_names)
DOMAIN = ScriptSpec(
    "domain", ("domains", "domain_conf"), args=("operation", "domain", "changes"), reply=int)

#: The robots.txt cache (on the base prefix): "get" reads and maybe claims, "put" stores.
ROBOTS: ScriptSpec[Any] = ScriptSpec(
    "robots", ("robots", "robots_claims", "domains"),
    args=("operation", "origin", "entry", "claim_or_domain", "crawl_delay_ms"))

NOTIFY = ScriptSpec(
    "notify", ("notify_limits", "notify_digest", "notify_held"),
    args=("operation", "subject", "window_ms", "digest_ms", "threshold", "notice", "cap",
          "event"),
    reply=_notice_reply)

#: The Django outbox's report for ``zsched exporter`` (on the base prefix).
OUTBOX_REPORT = ScriptSpec(
    "outbox_report", ("outbox",), args=("pending", "dead", "oldest_age_ms"), reply=int)

#: Every script, by name.
SCRIPTS: dict[str, ScriptSpec[Any]] = {
    spec.name: spec
    for spec in (UPSERT, CLAIM, START, HEARTBEAT, ROUTED, RETRYING, SETTLE, REAP, RESCUE, LOST,
                 RELEASE, CONTROL, RELOCATE, DOMAIN, ROBOTS, NOTIFY, OUTBOX_REPORT)
}
