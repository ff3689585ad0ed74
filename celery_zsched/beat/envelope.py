"""The Redis transport's fast path: kombu's envelopes, built once per route, pushed in one pipeline.

kombu's Redis transport turns each message into a JSON envelope (base64 body,
headers, properties, delivery info) and LPUSHes it onto the queue's list. Per
message, Celery and kombu repeat work that is the same for every message of
one route: option merging, routing, exchange lookup, property defaults. Here
the first message of each route in a batch is built by Celery and kombu
themselves, caught where kombu would push it (``Channel._put``), and becomes
that route's template. The template is trusted only if rebuilding the same
message from it gives kombu's exact bytes (delivery tag aside); the route's
other messages are then built from it directly. Everything else (a route that
fails the check, a fanout exchange) still goes through Celery and kombu, and
only the final push is pipelined, as kombu 5.7's own publish batch does.

Messages are pushed with one LPUSH per list, whose values go in the order
sequential LPUSHes would leave them, so consumers see the same lists.

A message that republishes an occurrence (its second or later delivery: a dead
worker's, a lost or an unpublished message recovered) goes to the consuming end
of its list instead (RPUSH), as kombu's own restore of an unacknowledged message
does and RabbitMQ's requeue: recovered work runs next, not behind a backlog that
was queued after it. Among themselves, such messages keep their order.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Callable
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.utils import json as kombu_json


def redis_channel(producer: Any) -> Any | None:
    """The producer's kombu Redis channel, when its ``_put`` is kombu's own; else ``None``."""
    channel = producer.channel
    if not isinstance(channel, kombu_redis.Channel):
        return None
    if type(channel)._put is not kombu_redis.Channel._put or "_put" in vars(channel):
        return None
    return channel


class Message:
    """What differs between two messages of one route."""

    __slots__ = ("args", "argsrepr", "headers", "kwargs", "kwargsrepr", "task_id")

    def __init__(self, task_id: str, args: list[Any], kwargs: dict[str, Any],
                 argsrepr: str, kwargsrepr: str, headers: dict[str, Any]) -> None:
        self.task_id = task_id
        self.args = args
        self.kwargs = kwargs
        self.argsrepr = argsrepr
        self.kwargsrepr = kwargsrepr
        self.headers = headers


class _Template:
    """One route's envelope as JSON text, cut where the per-message values go.

    JSON text of a dict is its values' JSON between fixed separators, so the
    envelope of the route's first message, encoded with a marker in each
    per-message field, gives the text around them once; each message then
    costs the JSON of its own values only.
    """

    __slots__ = ("embed", "fields", "keys", "text")

    def __init__(self, message: dict[str, Any], keys: list[str], own: tuple[str, ...]) -> None:
        self.keys = keys
        body = json.loads(base64.b64decode(message["body"]))
        embed = _ENCODE(body[2]) if isinstance(body, list) and len(body) == 3 else "null"
        marked = dict(message)
        marked["body"] = _mark("body")
        marked["headers"] = headers = dict(message["headers"])
        for name in ("id", "root_id", "argsrepr", "kwargsrepr", *own):
            headers[name] = _mark(f"h:{name}")
        marked["properties"] = properties = dict(message["properties"])
        properties["correlation_id"] = _mark("h:id")
        properties["delivery_tag"] = _mark("tag")
        # Text before the first field, the field, text, ..., the text after the last one.
        pieces = _MARK.split(_ENCODE(marked))
        self.text = "%s".join(text.replace("%", "%%") for text in pieces[::2])
        self.fields = pieces[1::2]
        self.embed = embed

    def build(self, message: Message, delivery_tag: str) -> str:
        """The envelope kombu would push for this message."""
        task_id = f'"{message.task_id}"'
        args = message.args
        body = f"[{_json(args) if args else '[]'}, {_ENCODE(message.kwargs)}, {self.embed}]"
        values = {"body": f'"{base64.b64encode(body.encode()).decode("ascii")}"',
                  "tag": f'"{delivery_tag}"', "h:id": task_id, "h:root_id": task_id,
                  "h:argsrepr": _STR(message.argsrepr), "h:kwargsrepr": _STR(message.kwargsrepr)}
        for name, value in message.headers.items():
            values["h:" + name] = _json(value)
        return self.text % tuple([values[field] for field in self.fields])


def _json(value: Any) -> str:
    """``_ENCODE(value)``, without its per-call set-up for strings and integers."""
    kind = type(value)
    if kind is str:
        return _STR(value)
    if kind is int:
        return int.__repr__(value)
    return _ENCODE(value)


def _mark(field: str) -> str:
    return f"\x00{field}\x00"


#: A marker as JSON text: the field's name between two encoded NULs, quoted.
_MARK = re.compile(r'"\\u0000([^"\\]+)\\u0000"')


#: kombu's JSON encoder, made once: ``kombu.utils.json.dumps`` makes one per call.
_ENCODE = kombu_json.JSONEncoder().encode
#: How it writes a string (it escapes everything but ASCII: ``ensure_ascii``).
_STR = json.encoder.encode_basestring_ascii


class RedisPush:
    """Collects a batch's envelopes per Redis list, and pushes them in one round trip."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.lists: dict[str, list[str]] = {}
        #: Envelopes for the consuming end of each list (recovered occurrences).
        self.front: dict[str, list[str]] = {}
        self.templates: dict[tuple[Any, ...], _Template | None] = {}
        self.random: list[int] = []

    def capture(self, send: Callable[[], None],
                front: bool = False) -> list[tuple[str, dict[str, Any]]]:
        """Run ``send`` (Celery's and kombu's publish) with kombu's final push caught.

        Returns each (list key, message) it would have pushed, and queues them
        here, serialized as kombu would (``front``: for the consuming end). A queue
        with an expiry is pushed by kombu itself (with its PEXPIREs), at once.
        """
        channel = self.channel
        caught: list[tuple[str, dict[str, Any]]] = []
        put = channel._put

        def catch(queue: str, message: dict[str, Any], **kwargs: Any) -> None:
            expires = getattr(channel, "_expires", None)
            if expires and queue in expires:
                self.push()  # keep the list's order
                put(queue, message, **kwargs)
                return
            priority = channel._get_message_priority(message, reverse=False)
            key = channel._q_for_pri(queue, priority)
            (self.front if front else self.lists).setdefault(key, []).append(
                kombu_json.dumps(message))
            caught.append((key, message))

        channel._put = catch
        try:
            send()
        finally:
            del channel._put
        return caught

    def send(self, route: tuple[Any, ...] | None, message: Message,
             publish: Callable[[], None], front: bool = False) -> None:
        """Queue ``message``: built from its route's template, or by ``publish`` (Celery's
        and kombu's own path), whose first message of a route tries to become the template.

        ``route`` names what the messages sharing a template have in common; ``None``:
        nothing, always ``publish``. ``front``: for the consuming end of its list.
        """
        if route is None:
            self.capture(publish, front)
            return
        template = self.templates.get(route, _UNKNOWN)
        if isinstance(template, _Template):
            payload = template.build(message, self._delivery_tag())
            lists = self.front if front else self.lists
            for key in template.keys:
                lists.setdefault(key, []).append(payload)
            return
        caught = self.capture(publish, front)
        if template is _UNKNOWN:
            self.templates[route] = self._learn(caught, message,
                                                self.front if front else self.lists)

    def _learn(self, caught: list[tuple[str, dict[str, Any]]], message: Message,
               lists: dict[str, list[str]]) -> _Template | None:
        """A template from kombu's message, if it rebuilds that message byte for byte."""
        if not caught or len({id(m) for _, m in caught}) != 1:
            return None
        key, first = caught[0]
        try:
            template = _Template(first, [k for k, _ in caught], tuple(message.headers))
            rebuilt = template.build(message, first["properties"]["delivery_tag"])
        except (KeyError, TypeError, ValueError):  # not the envelope this module knows
            return None
        return template if rebuilt == lists[key][-1] else None

    def _delivery_tag(self) -> str:
        """``str(uuid.uuid4())``, as kombu's virtual channel tags a message, minus the
        ``UUID``; the random bytes are read 1,000 tags at a time."""
        if not self.random:
            pool = os.urandom(16_000)
            self.random = [int.from_bytes(pool[i:i + 16], "big") for i in range(0, 16_000, 16)]
        value = self.random.pop() & _VERSION_MASK | _VERSION_4
        text = f"{value:032x}"
        return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"

    def push(self) -> None:
        """LPUSH what was collected, and RPUSH what goes to the front, one command per
        list, in one round trip."""
        if not self.lists and not self.front:
            return
        lists, self.lists = self.lists, {}
        front, self.front = self.front, {}
        with self.channel.conn_or_acquire() as client, client.pipeline(transaction=False) as pipe:
            for key, payloads in lists.items():
                pipe.lpush(key, *payloads)
            for key, payloads in front.items():
                # BRPOP takes the rightmost value: the first of them goes last.
                pipe.rpush(key, *reversed(payloads))
            pipe.execute()


_VERSION_MASK = ~((0xF000 << 64) | (0xC000 << 48))
_VERSION_4 = (4 << 76) | (0x8000 << 48)
_UNKNOWN = object()
