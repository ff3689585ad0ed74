"""The batched publish path sends exactly the messages ``app.send_task`` would.

The parity test runs on two transports, each against a real server: Redis (a
throwaway ``redis-server``, read back as raw JSON from its lists) and AMQP (the
local RabbitMQ, read back with kombu). On RabbitMQ every queue and exchange has
a name unique to the test and is deleted afterwards. tox's ``parity-oldest`` and
``parity-newest`` run this module against the oldest and the newest Celery and
kombu that pyproject.toml admits.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import time
import uuid
import warnings
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import celery
import pytest
import redis
from celery import Celery
from celery.exceptions import CDeprecationWarning
from celery.utils.saferepr import saferepr
from kombu import Connection, Exchange, Queue

from celery_zsched.beat import envelope
from celery_zsched.beat.publish import _send, fast_repr, publish_batch
from celery_zsched.core.job import Job
from celery_zsched.store import Claimed

AMQP_URL = os.environ.get("ZSCHED_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")

#: The app's clock during the test, so relative expiries become the same absolute time.
NOW = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)

#: Celery 5.7's send_task applies a registered task's own options; older ones do not.
SEND_TASK_APPLIES_TASK_OPTIONS = tuple(celery.VERSION[:2]) >= (5, 7)


class Names:
    """Queue and exchange names of one test: unique, so tests never share broker state."""

    def __init__(self) -> None:
        self.prefix = prefix = f"zsched-parity-{uuid.uuid4().hex[:12]}-"
        self.celery, self.q1, self.q2, self.q3 = (prefix + q for q in ("celery", "q1", "q2", "q3"))
        self.queues = [self.celery, self.q1, self.q2, self.q3]
        #: The exchange the declared task_queues share (missing queues get one of their own name).
        self.tasks = prefix + "tasks"
        self.exchanges = [*self.queues, self.tasks]


def rows(n: Names) -> list[dict[str, Any]]:
    """Two jobs of each route: the second of a route is built from its template on Redis."""
    first = _rows(n)
    second = [{**row, "id": f"{row.get('id', 'url')}-2"} for row in first]
    second[0]["url"] = "http://127.0.0.1:1/b"
    second[0]["meta"] = {"site": "b", "quote": "it's"}
    return first + second


def _rows(n: Names) -> list[dict[str, Any]]:
    return [
        {"url": "http://127.0.0.1:1/a", "meta": {"site": "a", "n": [1, 2.5, None, True]}},
        {"id": "plain", "task": "tasks.other", "args": [1, "two"], "kwargs": {"k": {"x": 1}}},
        {"id": "routed", "task": "tasks.other", "queue": n.q1, "priority": 5},
        {"id": "keyed", "task": "tasks.other", "queue": n.q2, "routing_key": n.q2},
        {"id": "quoted", "task": "tasks.other", "kwargs": {"s": "it's a \\ \n test"}},
        {"id": "expiring", "task": "tasks.other", "expires_s": 60},
        # tasks.own is registered with its own queue, priority and expires in some scenarios.
        {"id": "own", "task": "tasks.own", "args": [3]},
        {"id": "own-overridden", "task": "tasks.own", "queue": n.q1, "priority": 2},
    ]


#: What each scenario turns on (see ``configure``).
SCENARIOS: dict[str, set[str]] = {
    "defaults": set(),
    "task_routes": {"routes"},
    "task_options": {"own_task"},
    "no_missing_queues": {"own_task", "declared_queues"},
    "protocol_1": {"routes", "own_task", "protocol_1"},
}


def configure(app: Celery, n: Names, features: set[str]) -> None:
    """Apply a scenario's settings to a fresh app, then finalize it."""
    conf = app.conf
    conf.task_default_queue = conf.task_default_exchange = n.celery
    conf.task_default_routing_key = n.celery
    if "routes" in features:
        conf.task_routes = {"tasks.other": {"queue": n.q1}}
    if "declared_queues" in features:
        tasks = Exchange(n.tasks, type="direct")
        conf.task_create_missing_queues = False
        conf.task_queues = [Queue(name, tasks, routing_key=name) for name in n.queues]
    if "protocol_1" in features:
        conf.task_protocol = 1
    with warnings.catch_warnings():
        # Celery 5.7 deprecates the queue and priority task options (for 6.0).
        warnings.filterwarnings("ignore", r"\s*The '(queue|priority)' task attribute is deprecated",
                                CDeprecationWarning)
        if "own_task" in features:
            @app.task(name="tasks.own", queue=n.q3, priority=7, expires=120, shared=False)
            def own(*args: Any, **kwargs: Any) -> None:
                """Never runs: only its options matter."""
        app.finalize()


def _claimed(row: dict[str, Any], occurrence: int) -> Claimed:
    job = Job.from_dict({"interval_s": 60, **row})
    return Claimed(job, occurrence, 1, 1, occurrence, occurrence + 3)


def _task_id(msg: dict[str, Any]) -> str:
    # Protocol 2 carries the id in the headers, protocol 1 in the body.
    return str(msg["headers"].get("id") or msg["body"]["id"])


class RedisBroker:
    """Reads messages straight from kombu's Redis lists, as raw JSON."""

    def __init__(self, url: str, client: redis.Redis) -> None:
        self.url = url
        self.client = client

    @staticmethod
    def _keys(queue: str) -> list[str]:
        """The Redis lists of a queue: kombu keeps priorities 3, 6, 9 in their own lists."""
        return [queue] + [f"{queue}\x06\x16{step}" for step in (3, 6, 9)]

    def drain(self, queues: list[str], count: int) -> dict[str, dict[str, Any]]:
        """Every message on ``queues`` by task id, minus what differs per publish."""
        out: dict[str, dict[str, Any]] = {}
        for queue in queues:
            for key in self._keys(queue):
                for raw in self.client.lrange(key, 0, -1):
                    msg = json.loads(raw)
                    msg["queue"], msg["list"], msg["raw_body"] = queue, key, msg["body"]
                    msg["body"] = json.loads(base64.b64decode(msg["body"]))
                    tag = msg["properties"].pop("delivery_tag")
                    # The whole envelope byte for byte, but for its one random field.
                    msg["raw"] = raw.replace(json.dumps(tag), '"<tag>"')
                    out[_task_id(msg)] = msg
        self.client.delete(*(key for q in queues for key in self._keys(q)))
        return out

    def close(self) -> None:
        """Nothing to clean: the throwaway server is flushed after each test."""


class AmqpBroker:
    """Reads messages back from RabbitMQ with kombu, and deletes the test's queues and exchanges."""

    def __init__(self, url: str, names: Names) -> None:
        self.url = url
        self.names = names
        self.apps: list[Celery] = []
        self.connection = Connection(url, connect_timeout=5)

    def drain(self, queues: list[str], count: int) -> dict[str, dict[str, Any]]:
        """Take every message off ``queues`` (waiting up to 10 s for ``count``)."""
        out: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + 10
        while True:
            for name in queues:
                for message in self._get_all(name):
                    info = dict(message.delivery_info)
                    for per_publish in ("delivery_tag", "message_count"):
                        info.pop(per_publish, None)
                    msg = {
                        "queue": name, "delivery_info": info, "headers": message.headers,
                        "properties": message.properties, "raw_body": message.body,
                        "content_type": message.content_type,
                        "content_encoding": message.content_encoding, "body": message.decode(),
                    }
                    out[_task_id(msg)] = msg
            if len(out) >= count or time.monotonic() > deadline:
                return out
            time.sleep(0.05)

    def _get_all(self, queue: str) -> Iterator[Any]:
        """Take the messages off one queue; none if nothing declared it (yet)."""
        with self.connection.channel() as channel:
            try:
                while (message := Queue(queue, channel=channel, no_declare=True)
                       .get(no_ack=True, accept=["json"])) is not None:
                    yield message
            except self.connection.channel_errors as exc:
                if getattr(exc, "reply_code", None) != 404:
                    raise

    def close(self) -> None:
        """Delete every queue and exchange the test declared, however it ended."""
        queues, exchanges = set(self.names.queues), set(self.names.exchanges)
        for app in self.apps:  # and whatever the apps' queues name, to be sure
            for queue in app.amqp.queues.values():
                queues.add(queue.name)
                if queue.exchange is not None and queue.exchange.name:
                    exchanges.add(queue.exchange.name)
        for kind, names in (("queue", queues), ("exchange", exchanges)):
            for name in sorted(names):
                assert name.startswith(self.names.prefix), name  # never anything not ours
                with self.connection.channel() as channel:
                    getattr(channel, f"{kind}_delete")(name)
        self.connection.close()


@functools.cache
def _amqp_reachable(url: str) -> str | None:
    """``None``, or why RabbitMQ cannot be reached (asked once per session)."""
    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.connect()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@pytest.fixture(params=["redis", "amqp"])
def broker(request: pytest.FixtureRequest, names: Names) -> Iterator[RedisBroker | AmqpBroker]:
    """A real broker of each transport: the throwaway Redis, and the local RabbitMQ."""
    instance: RedisBroker | AmqpBroker
    if request.param == "redis":
        instance = RedisBroker(request.getfixturevalue("redis_url"),
                               request.getfixturevalue("rclient"))
    else:
        problem = _amqp_reachable(AMQP_URL)
        if problem is not None:
            where = Connection(AMQP_URL).as_uri()  # password masked
            pytest.skip(f"RabbitMQ unreachable at {where} ({problem})")
        instance = AmqpBroker(AMQP_URL, names)
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
def names() -> Names:
    return Names()


def scenario_app(broker: RedisBroker | AmqpBroker, names: Names, scenario: str,
                 monkeypatch: pytest.MonkeyPatch) -> Celery:
    """An app on ``broker`` configured as ``scenario`` says, its clock stopped at ``NOW``."""
    app = Celery("pub", broker=broker.url, set_as_current=False)
    if isinstance(broker, AmqpBroker):
        broker.apps.append(app)
    configure(app, names, SCENARIOS[scenario])
    monkeypatch.setattr(app, "now", lambda: NOW)
    return app


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_batched_messages_equal_send_task_messages(
        broker: RedisBroker | AmqpBroker, names: Names, scenario: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Headers, properties and body of each batched message match send_task's."""
    app = scenario_app(broker, names, scenario, monkeypatch)
    jobs = rows(names)
    queues = names.queues
    reference = [_claimed(row, 1_000 + i) for i, row in enumerate(jobs)]
    batched = [_claimed(row, 1_000 + i) for i, row in enumerate(jobs)]
    templated = _count_templated(monkeypatch)
    try:
        with app.producer_or_acquire() as producer:
            for claimed in reference:
                _send(app, producer, claimed)
        expected = broker.drain(queues, len(jobs))
        with app.producer_or_acquire() as producer:
            publish_batch(app, producer, batched)
        got = broker.drain(queues, len(jobs))
    finally:
        app.close()
    assert len(expected) == len(jobs)
    assert got == expected
    # On Redis, the second message of each route came from its template (protocol 1
    # has none); the comparison above covers them.
    if isinstance(broker, RedisBroker):
        if scenario == "protocol_1":
            assert templated["messages"] == 0
        elif scenario == "defaults":  # 16 messages over 7 routes
            assert templated["messages"] == len(jobs) - 7
        else:
            assert templated["messages"] > 0
    # The scenario really did what it says (or the comparison above proves little).
    task_ids = {claimed.job.id: claimed.task_id for claimed in reference}
    own = expected[task_ids["own"]]
    if "own_task" in SCENARIOS[scenario] and SEND_TASK_APPLIES_TASK_OPTIONS:
        assert (own["queue"], own["properties"]["priority"]) == (names.q3, 7)
    else:
        assert own["queue"] == names.celery
    assert expected[task_ids["routed"]]["queue"] == names.q1
    if "routes" in SCENARIOS[scenario]:
        assert expected[task_ids["plain"]]["queue"] == names.q1
    if "protocol_1" in SCENARIOS[scenario]:
        assert "task" in own["body"] and "lang" not in own["headers"]


def _count_templated(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the messages built from a template (not those that checked one)."""
    counts = {"messages": 0}
    build, learn = envelope._Template.build, envelope.RedisPush._learn

    def counting_build(template: Any, message: Any, tag: str) -> str:
        counts["messages"] += 1
        return build(template, message, tag)

    def counting_learn(push: Any, caught: Any, message: Any, lists: Any) -> Any:
        template = learn(push, caught, message, lists)
        counts["messages"] -= template is not None  # its check built one
        return template

    monkeypatch.setattr(envelope._Template, "build", counting_build)
    monkeypatch.setattr(envelope.RedisPush, "_learn", counting_learn)
    return counts


@pytest.mark.parametrize("value", [
    (), {}, [1, 2.5, None, True], {"a": {"b": {"c": {"d": [1]}}}}, ("x" * 5000,),
    {"s": "it's"}, {"s": "back\\slash"}, {"s": "new\nline"}, {1: "int key"},
    {"set": {1, 2}}, [b"bytes"], {"u": "ünïcode"}, [[[[[[1]]]]]],
])
def test_fast_repr_equals_saferepr(value: Any) -> None:
    """fast_repr is saferepr wherever it takes its shortcut, and defers to it elsewhere."""
    for maxlen, maxlevels in ((1024, 3), (20, 3), (4096, 0)):
        assert fast_repr(value, maxlen, maxlevels) == saferepr(value, maxlen, maxlevels=maxlevels)



def test_templated_messages_get_distinct_uuid4_delivery_tags() -> None:
    """As kombu tags each message with str(uuid4()): well-formed, and none twice."""
    push = envelope.RedisPush(channel=None)
    tags = [push._delivery_tag() for _ in range(5_000)]
    assert len(set(tags)) == len(tags)
    for tag in tags:
        parsed = uuid.UUID(tag)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, tag)


def test_publish_signal_receivers_see_every_message(redis_url: str, rclient: redis.Redis) -> None:
    """A before_task_publish receiver (tracing injects its context so) runs for every
    message and its changes are sent: templates are not used while one is connected."""
    app = Celery("signals", broker=redis_url, set_as_current=False)
    app.conf.task_default_queue = "signalled"
    jobs = [_claimed({"url": f"http://127.0.0.1:1/{i}"}, 1_000 + i) for i in range(5)]

    def stamp(headers: dict[str, Any], **_: Any) -> None:
        headers["traceparent"] = f"00-{headers['id'].replace('-', '')}-01"

    celery.signals.before_task_publish.connect(stamp)
    try:
        with app.producer_or_acquire() as producer:
            publish_batch(app, producer, jobs)
    finally:
        celery.signals.before_task_publish.disconnect(stamp)
        app.close()
    headers = [json.loads(raw)["headers"] for raw in rclient.lrange("signalled", 0, -1)]
    assert sorted(h["traceparent"] for h in headers) == sorted(
        f"00-{c.task_id.replace('-', '')}-01" for c in jobs)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_more_headers_reach_each_message_and_change_nothing_else(
        broker: RedisBroker | AmqpBroker, names: Names, scenario: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Tracing's ``traceparent`` is each message's own header, on both paths; the rest of
    the message is the one published without it."""
    app = scenario_app(broker, names, scenario, monkeypatch)
    jobs = rows(names)
    queues = names.queues
    claimed = [_claimed(row, 1_000 + i) for i, row in enumerate(jobs)]
    more = [{"traceparent": f"00-{i + 1:032x}-{i + 1:016x}-01"} for i in range(len(jobs))]
    try:
        with app.producer_or_acquire() as producer:
            publish_batch(app, producer, claimed)
        plain = broker.drain(queues, len(jobs))
        with app.producer_or_acquire() as producer:
            for one, extra in zip(claimed, more, strict=True):
                _send(app, producer, one, extra)
        expected = broker.drain(queues, len(jobs))
        with app.producer_or_acquire() as producer:
            publish_batch(app, producer, claimed, more)
        got = broker.drain(queues, len(jobs))
    finally:
        app.close()
    assert len(plain) == len(jobs)
    assert got == expected
    for one, extra in zip(claimed, more, strict=True):
        message = dict(got[one.task_id])
        # The raw envelope holds the header too; ``got == expected`` compared it.
        message.pop("raw", None)
        headers = dict(message.pop("headers"))
        assert headers.pop("traceparent") == extra["traceparent"]
        properties = dict(message.pop("properties"))
        if "application_headers" in properties:  # AMQP: the headers again
            properties["application_headers"] = dict(properties["application_headers"])
            assert properties["application_headers"].pop("traceparent") == extra["traceparent"]
        without = {k: v for k, v in plain[one.task_id].items() if k != "raw"}
        assert {**message, "headers": headers, "properties": properties} == without


@pytest.mark.parametrize("receiver", [False, True], ids=["templated", "kombu"])
def test_republished_occurrences_go_to_the_front_of_their_list_in_their_order(
        redis_url: str, rclient: redis.Redis, receiver: bool) -> None:
    """A second or later delivery (a dead worker's, a lost message's) is taken next by a
    consumer, ahead of first deliveries already waiting and of those in its batch, as
    kombu's own restore puts an unacknowledged message back; first deliveries keep
    kombu's order. A publish receiver sends every message through kombu: the same."""
    app = Celery("front", broker=redis_url, set_as_current=False)
    app.conf.task_default_queue = "front"

    def job(name: str, deliveries: int) -> Claimed:
        claimed = _claimed({"url": f"http://127.0.0.1:1/{name}"}, 1_000)
        return Claimed(claimed.job, 1_000, 1, deliveries, 1_000, 1_003)

    waiting = [job("old-a", 1), job("old-b", 1)]
    batch = [job("new-a", 1), job("again-a", 2), job("new-b", 1), job("again-b", 3)]

    def stamp(**_: Any) -> None:
        pass

    if receiver:
        celery.signals.before_task_publish.connect(stamp)
    try:
        with app.producer_or_acquire() as producer:
            publish_batch(app, producer, waiting)
            publish_batch(app, producer, batch)
    finally:
        celery.signals.before_task_publish.disconnect(stamp)
        app.close()
    # BRPOP takes from the right: the consuming order.
    taken = [json.loads(raw)["headers"] for raw in reversed(rclient.lrange("front", 0, -1))]
    by_id = {c.task_id: c.job.url for c in waiting + batch}
    assert [by_id[h["id"]].rsplit("/", 1)[1] for h in taken] == [
        "again-a", "again-b", "old-a", "old-b", "new-a", "new-b"]
