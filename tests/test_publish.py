"""The batched publish path sends exactly the messages ``app.send_task`` would."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery
from celery.utils.saferepr import saferepr

from celery_zsched.config import Settings
from celery_zsched.job import Job
from celery_zsched.publish import _send, fast_repr, publish_batch
from celery_zsched.store import Claimed

ROWS: list[dict[str, Any]] = [
    {"url": "http://127.0.0.1:1/a", "meta": {"site": "a", "n": [1, 2.5, None, True]}},
    {"id": "plain", "task": "tasks.other", "args": [1, "two"], "kwargs": {"k": {"x": 1}}},
    {"id": "routed", "task": "tasks.other", "queue": "q1", "priority": 5},
    {"id": "keyed", "task": "tasks.other", "queue": "q2", "routing_key": "q2"},
    {"id": "quoted", "task": "tasks.other", "kwargs": {"s": "it's a \\ \n test"}},
    {"id": "expiring", "task": "tasks.other", "expires_s": 60},
]


def _claimed(row: dict[str, Any], occurrence: int) -> Claimed:
    job = Job.from_dict({"interval_s": 60, **row})
    return Claimed(job, occurrence, 1, 1, occurrence, occurrence + 3)


def _keys(queue: str) -> list[str]:
    """The Redis lists of a queue: kombu keeps priorities 3, 6, 9 in their own lists."""
    return [queue] + [f"{queue}\x06\x16{step}" for step in (3, 6, 9)]


def _messages(client: redis.Redis, queues: list[str]) -> dict[str, dict[str, Any]]:
    """Every message on ``queues`` by task id, minus what differs per publish."""
    out: dict[str, dict[str, Any]] = {}
    for queue in queues:
        for raw in [m for key in _keys(queue) for m in client.lrange(key, 0, -1)]:
            msg = json.loads(raw)
            msg["body"] = json.loads(base64.b64decode(msg["body"]))
            msg["properties"].pop("delivery_tag")
            headers = msg["headers"]
            # as_task_v2 turns a relative expiry into an absolute time at send time.
            if headers.get("expires"):
                headers["expires"] = headers["expires"][:16]
            out[headers["id"]] = msg
    return out


@pytest.mark.parametrize("routes", [None, {"tasks.other": {"queue": "q1"}}])
def test_batched_messages_equal_send_task_messages(
        redis_url: str, rclient: redis.Redis, routes: dict[str, Any] | None,
        make_settings: Callable[..., Settings]) -> None:
    """Headers, properties and body of each batched message match send_task's."""
    app = Celery("pub", broker=redis_url, set_as_current=False)
    app.conf.task_routes = routes
    queues = ["celery", "q1", "q2"]
    reference = [_claimed(row, 1_000 + i) for i, row in enumerate(ROWS)]
    batched = [_claimed(row, 1_000 + i) for i, row in enumerate(ROWS)]
    with app.producer_or_acquire() as producer:
        for claimed in reference:
            _send(app, producer, claimed)
    expected = _messages(rclient, queues)
    rclient.delete(*(key for q in queues for key in _keys(q)))
    with app.producer_or_acquire() as producer:
        publish_batch(app, producer, batched)
    got = _messages(rclient, queues)
    assert len(expected) == len(ROWS)
    assert got == expected


@pytest.mark.parametrize("value", [
    (), {}, [1, 2.5, None, True], {"a": {"b": {"c": {"d": [1]}}}}, ("x" * 5000,),
    {"s": "it's"}, {"s": "back\\slash"}, {"s": "new\nline"}, {1: "int key"},
    {"set": {1, 2}}, [b"bytes"], {"u": "ünïcode"}, [[[[[[1]]]]]],
])
def test_fast_repr_equals_saferepr(value: Any) -> None:
    """fast_repr is saferepr wherever it takes its shortcut, and defers to it elsewhere."""
    for maxlen, maxlevels in ((1024, 3), (20, 3), (4096, 0)):
        assert fast_repr(value, maxlen, maxlevels) == saferepr(value, maxlen, maxlevels=maxlevels)
