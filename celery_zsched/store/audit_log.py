"""Reading the audit trail: each partition's capped stream of changes.

The values (:class:`~celery_zsched.core.audit.Actor`, :class:`~celery_zsched.core.audit.Change`,
the actions) are the core's; this module reads them back from Redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_zsched.core import stream_ids
from celery_zsched.core.audit import Change
from celery_zsched.store.errors import redis_unavailable

if TYPE_CHECKING:
    from celery_zsched.store import Store

#: Stream entries read per round trip while looking for one job's changes.
SCAN_PAGE = 1000


def _checked(store: Store) -> None:
    if not store.layout_checked:
        store.check_layout()


def _decoded(rows: Any) -> list[tuple[str, dict[str, str]]]:
    return [(str(sid), {str(k): str(v) for k, v in (fields or {}).items()})
            for sid, fields in rows or []]


def history(store: Store, job_id: str, limit: int = 20) -> list[Change]:
    """The newest ``limit`` recorded changes of ``job_id``, newest first.

    Reads each partition's stream backwards, a page at a time, until it has
    ``limit`` of the job's changes or the stream ends. A job's changes are in
    its partition's stream, unless ``zsched repartition`` moved the job since:
    so every partition is read (with one partition, the default, that is one
    stream). A job changed rarely among many costs a scan of the streams (at
    most ``zsched_audit_maxlen`` entries each), a page per round trip.
    """
    found: list[Change] = []
    with redis_unavailable():
        _checked(store)
        for part, keys in enumerate(store.parts):
            label = f"{part}/" if store.partitions > 1 else ""
            found += _scan(store, keys.audit, job_id, limit, label)
    found.sort(key=lambda c: (c.at_ms, stream_ids.order(c.stream_id)), reverse=True)
    return found[:limit]


def _scan(store: Store, key: str, job_id: str, limit: int, label: str) -> list[Change]:
    out: list[Change] = []
    upper = "+"
    while len(out) < limit:
        rows = _decoded(store.client.xrevrange(key, max=upper, min="-", count=SCAN_PAGE))
        out += [change for sid, fields in rows if fields.get("id") == job_id
                and not (change := Change.from_entry(label + sid, fields)).empty]
        if len(rows) < SCAN_PAGE:
            break
        upper = f"({rows[-1][0]}"
    return out


def entries(store: Store, after: str = "0", count: int = 1000,
            part: int = 0) -> list[tuple[str, dict[str, str]]]:
    """Audit entries of partition ``part`` after stream id ``after``, oldest first."""
    with redis_unavailable():
        _checked(store)
        return _decoded(store.client.xrange(store.parts[part].audit,
                                            min=f"({after}" if after != "0" else "-",
                                            count=count))


def cursor(store: Store, part: int = 0) -> str:
    """Stream id of the last audit entry of partition ``part`` copied into the
    Django change history ("0" before any)."""
    with redis_unavailable():
        return str(store.client.get(store.parts[part].audit_cursor) or "0")


def advance_cursor(store: Store, to: str, part: int = 0) -> bool:
    """Move partition ``part``'s audit cursor forward to ``to``; never backwards
    (two drains may race)."""
    return store.advance_cursor(store.parts[part].audit_cursor, to)
