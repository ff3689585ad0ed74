"""The audit trail: who changed which job, when, how (a field diff) and why.

Every mutating :class:`~celery_zsched.store.Store` method takes the
:class:`Actor` that asks for it (``by=``) and an optional ``note=``. The Lua
script that makes the change appends one entry per changed job to its
partition's capped audit stream in the same call, so a change and its record
are one atomic step, and the diff is taken against the definition the change
really replaced. A change that changes nothing (an unchanged re-import, a pause
of a paused job) records nothing.

Stream entry fields (written by ``upsert.lua`` and ``control.lua``):
``id`` job id, ``action``, ``kind`` and ``by`` (the actor), ``note`` (when
given), and then: ``def``, the definition JSON (created, or deleted); or
``old``, ``new`` and ``was`` (an edit: the replaced and the new definition,
and whether the job was enabled, "1"/"0"); or ``diff``, JSON
``{field: [old, new]}`` (pause and resume: ``enabled``). The scripts only
compare strings; :meth:`Change.from_entry` works out an edit's field diff when
the entry is read, which keeps a bulk import cheap. The entry id's
milliseconds are the time of the change on the Redis clock (``at`` instead,
when ``zsched repartition`` moved the entry to another stream).
"""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from celery_zsched.core import stream_ids
from celery_zsched.core.errors import ValidationError
from celery_zsched.core.job import Job

#: Who may change a job.
ACTOR_KINDS = ("admin", "cli", "import", "reconcile", "api")
#: What a change did. ``reset`` is the admin's "reset failures".
ACTIONS = ("create", "edit", "pause", "resume", "run_now", "delete", "requeue", "purge",
           "reset")
#: Longest note kept (a note is a sentence, not a document).
NOTE_MAX = 1000
#: Longest actor name kept.
NAME_MAX = 150


def _job_defaults() -> dict[str, Any]:
    job = Job(id="_", task="_")
    return {name: getattr(job, name) for name in job.__dataclass_fields__
            if name not in ("id", "task")}


#: A field's value where a definition leaves it out (``Job.to_json`` omits defaults).
_FIELD_DEFAULTS = _job_defaults()


def local_user() -> str:
    """``user@host`` of this process: who ran a CLI or a management command."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for the uid (containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class Actor:
    """Who made a change: a ``kind`` of :data:`ACTOR_KINDS` and a name.

    The name says which one: the admin's username, ``user@host`` for the CLI
    and management commands, the file of an import.
    """

    kind: str = "api"
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ACTOR_KINDS:
            raise ValidationError("actor kind", self.kind,
                                  f"must be one of {', '.join(ACTOR_KINDS)}")
        if len(self.name) > NAME_MAX:
            object.__setattr__(self, "name", self.name[:NAME_MAX])

    @classmethod
    def cli(cls) -> Actor:
        """The user of this shell."""
        return cls("cli", local_user())

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}" if self.name else self.kind


#: The actor of store calls that name none (Python code using the API).
API = Actor("api")


def check_note(note: str) -> str:
    """``note`` trimmed; raises :class:`ValidationError` (field ``note``) when too long."""
    note = note.strip()
    if len(note) > NOTE_MAX:
        raise ValidationError("note", f"{len(note)} characters",
                              f"must be at most {NOTE_MAX} characters")
    return note


def audit_args(maxlen: int, by: Actor | None, note: str) -> dict[str, Any]:
    """The ARGV values the mutating scripts take to record a change."""
    actor = by or API
    return {"audit_maxlen": maxlen, "actor_kind": actor.kind, "actor_name": actor.name,
            "note": check_note(note)}


@dataclass(frozen=True)
class Change:
    """One recorded change of one job."""

    job_id: str
    #: Epoch ms on the Redis clock.
    at_ms: int
    actor: Actor
    action: str
    #: ``{field: [old, new]}`` of the definition fields that changed (``enabled``
    #: is the paused state). A create lists the fields its definition sets, from
    #: ``None``; a delete the fields the deleted definition set, to ``None``.
    diff: dict[str, list[Any]] = field(default_factory=dict)
    note: str = ""
    #: The stream entry id (``partition/id`` with several partitions).
    stream_id: str = ""

    @property
    def empty(self) -> bool:
        """An edit that changed no value (a number spelt another way): not shown."""
        return self.action == "edit" and not self.diff

    @property
    def at(self) -> datetime:
        """The time of the change, UTC."""
        return datetime.fromtimestamp(self.at_ms / 1000, tz=timezone.utc)

    @classmethod
    def from_entry(cls, stream_id: str, fields: Mapping[str, str]) -> Change:
        """The change of one audit stream entry (``stream_id`` may carry ``partition/``)."""
        # "at": an entry that repartition moved to another stream keeps its time.
        at_ms = int(fields.get("at") or stream_ids.millis(stream_id))
        action = fields.get("action", "")
        if "def" in fields:
            # The fields the definition sets: the others are at their defaults.
            definition = json.loads(fields["def"])
            gone = action == "delete"
            diff = {name: [value, None] if gone else [None, value]
                    for name, value in definition.items() if name != "id"}
        elif "old" in fields:
            diff = definition_diff(json.loads(fields["old"]), json.loads(fields["new"]),
                                   was_enabled=fields.get("was") != "0")
        else:
            diff = {name: list(pair)
                    for name, pair in json.loads(fields.get("diff") or "{}").items()}
        kind = fields.get("kind", "api")
        return cls(job_id=fields.get("id", ""), at_ms=at_ms,
                   actor=Actor(kind if kind in ACTOR_KINDS else "api", fields.get("by", "")),
                   action=action, diff=dict(sorted(diff.items())),
                   note=fields.get("note", ""), stream_id=stream_id)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record (``zsched history --json``)."""
        return {"job_id": self.job_id, "at": self.at.isoformat().replace("+00:00", "Z"),
                "at_ms": self.at_ms, "actor_kind": self.actor.kind,
                "actor_name": self.actor.name, "action": self.action, "diff": self.diff,
                "note": self.note, "stream_id": self.stream_id}


def definition_diff(old: Mapping[str, Any], new: Mapping[str, Any], *,
                    was_enabled: bool) -> dict[str, list[Any]]:
    """``{field: [old, new]}`` of two stored definitions (``Job.to_json``).

    A field a definition leaves out is at its default. ``enabled`` is compared
    as the paused state had it (``was_enabled``): the stored definition keeps
    the value it was last written with.
    """
    old = {**old, "enabled": was_enabled}
    diff: dict[str, list[Any]] = {}
    for name in sorted((set(old) | set(new)) - {"id"}):
        before = old.get(name, _FIELD_DEFAULTS.get(name))
        after = new.get(name, _FIELD_DEFAULTS.get(name))
        if before != after:  # 60 and 60.0 are one interval
            diff[name] = [before, after]
    return diff
