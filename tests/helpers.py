"""Helpers shared by several test modules."""

from __future__ import annotations

import socket
from typing import Any

from celery_zsched.store import Store


def store_snapshot(store: Store) -> dict[str, Any]:
    """Everything a write could change, read with the store's own key names.

    Comparing two snapshots proves a rejected or stale operation wrote nothing.
    """
    c, k = store.client, store.keys
    return {
        "defs": c.hgetall(k.defs),
        "state": c.hgetall(k.state),
        "schedule": c.zrange(k.schedule, 0, -1, withscores=True),
        "queued": c.zrange(k.queued, 0, -1, withscores=True),
        "leases": c.zrange(k.leases, 0, -1, withscores=True),
        "paused": c.smembers(k.paused),
        "dead": c.zrange(k.dead, 0, -1, withscores=True),
        "static": c.smembers(k.static),
        "events": c.xlen(k.events),
        "counters": c.hgetall(k.counters),
        "keys": c.exists(*k.all()),
    }


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
