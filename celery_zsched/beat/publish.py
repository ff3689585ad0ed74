"""Publish a claimed batch as Celery messages, pipelined where the broker allows."""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

from celery import signals
from celery.app.routes import MapRoute
from celery.utils.functional import maybe_evaluate
from celery.utils.nodenames import anon_nodename
from celery.utils.saferepr import saferepr
from kombu.common import Broadcast

from celery_zsched.beat.envelope import Message, RedisPush, redis_channel
from celery_zsched.store import Claimed


def message_args(claimed: Claimed) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword arguments of a job's task.

    A URL job's task receives ``url=`` and ``meta=`` (plus any kwargs of its own).
    """
    job = claimed.job
    kwargs = dict(job.kwargs)
    if job.url is not None:
        kwargs["url"] = job.url
        kwargs["meta"] = job.meta
    return list(job.args), kwargs


def routing_options(claimed: Claimed) -> dict[str, Any]:
    """The job's queue, routing key and priority, as ``send_task`` options.

    A job's ``expires_s`` is not among them: Celery would turn it into an
    absolute time on beat's clock and compare it with the worker's, so skewed
    hosts would discard every run. The worker's start checks it on Redis' clock
    instead (the ``zsched_expires_ms`` header).
    """
    job = claimed.job
    options: dict[str, Any] = {}
    if job.queue:
        options["queue"] = job.queue
    if job.routing_key:
        options["routing_key"] = job.routing_key
    if job.priority is not None:
        options["priority"] = job.priority
    return options


def publish_batch(app: Any, producer: Any, jobs: Sequence[Claimed],
                  more_headers: Sequence[Mapping[str, str]] | None = None) -> None:
    """Send every job through one producer.

    Messages are the ones ``app.send_task`` would send, built by
    :class:`_BatchSender` with the per-task work done once per batch. On kombu's
    Redis transport the batch's messages are pushed in one round trip, most of
    them built from a per-route template (:mod:`celery_zsched.beat.envelope`);
    elsewhere, inside ``Producer.batch()`` where the transport buffers, or one
    publish each. ``more_headers`` (tracing's ``traceparent``), in the order of
    ``jobs``, are added to each message's own.
    """
    if not jobs:
        return
    channel = redis_channel(producer)
    if channel is not None and _no_publish_receivers() \
            and (sender := _BatchSender.make(app, producer, True)) is not None:
        push = RedisPush(channel)
        extras = more_headers if more_headers is not None else [None] * len(jobs)
        with producer.connection._reraise_as_library_errors():
            for claimed, more in zip(jobs, extras, strict=True):
                sender.send(claimed, push, more)
            push.push()
        return
    if channel is not None and any(claimed.republished for claimed in jobs):
        _republished_first(app, producer, RedisPush(channel), jobs, more_headers)
        return
    batch = producer.batch(max_size=max(1, len(jobs))) if hasattr(producer, "batch") else None
    sender = _BatchSender.make(app, producer, buffered=batch is not None and _buffers(producer))
    with contextlib.ExitStack() as stack:
        if batch is not None:
            stack.enter_context(batch)
        if sender is None:
            extras = more_headers if more_headers is not None else [None] * len(jobs)
            for claimed, more in zip(jobs, extras, strict=True):
                _send(app, producer, claimed, more)
            return
        # send_task wraps each publish in this; the batch's flush stays outside it.
        stack.enter_context(producer.connection._reraise_as_library_errors())
        if more_headers is None:
            for claimed in jobs:
                sender.send(claimed)
        else:
            for claimed, more in zip(jobs, more_headers, strict=True):
                sender.send(claimed, None, more)


def _republished_first(app: Any, producer: Any, front: RedisPush, jobs: Sequence[Claimed],
                       more_headers: Sequence[Mapping[str, str]] | None) -> None:
    """:func:`publish_batch` where publish receivers rule templates out: republished
    occurrences still go to the front of their lists, through ``send_task`` (its
    signals fire) with only kombu's final push caught; the rest as usual."""
    rest: list[Claimed] = []
    rest_more: list[Mapping[str, str]] = []
    for i, claimed in enumerate(jobs):
        more = more_headers[i] if more_headers is not None else None
        if claimed.republished:
            front.capture(functools.partial(_send, app, producer, claimed, more), True)
        else:
            rest.append(claimed)
            if more is not None:
                rest_more.append(more)
    publish_batch(app, producer, rest, None if more_headers is None else rest_more)
    front.push()


def _no_publish_receivers() -> bool:
    """Whether nothing listens to Celery's publish signals (templated messages send none)."""
    return not any(signal.receivers for signal in (
        signals.before_task_publish, signals.after_task_publish, signals.task_sent))


def headers_of(claimed: Claimed, more: Mapping[str, str] | None) -> dict[str, Any]:
    """The message's headers: the occurrence's, and ``more`` (tracing's) if any."""
    headers = claimed.headers()
    if more:
        headers.update(more)
    return headers


def _send(app: Any, producer: Any, claimed: Claimed,
          more: Mapping[str, str] | None = None) -> None:
    """The reference path: one ``app.send_task`` per job."""
    args, kwargs = message_args(claimed)
    app.send_task(
        claimed.job.task, args=args, kwargs=kwargs, task_id=claimed.task_id,
        headers=headers_of(claimed, more), producer=producer, **routing_options(claimed),
    )


def _buffers(producer: Any) -> bool:
    """Whether ``producer.batch()`` really buffers on this transport (kombu's own tests)."""
    if not getattr(producer, "supports_batch_publish", False):
        return False
    channel = producer.channel
    return (getattr(channel, "create_publish_batch", None) is not None
            and bool(getattr(channel, "supports_batch_publish", True)))


def fast_repr(obj: Any, maxlen: int, maxlevels: int) -> str:
    """``saferepr(obj, maxlen, maxlevels)``, cheaply for plain JSON values.

    For dicts, lists, tuples, ints, floats, bools, None and strings without quotes,
    backslashes or unprintable characters, nested at most ``maxlevels`` deep,
    whose ``repr`` is shorter than ``maxlen``, ``saferepr`` returns exactly
    ``repr(obj)``; anything else goes to ``saferepr`` itself.
    """
    if _plain(obj, 0, maxlevels):
        text = repr(obj)
        if len(text) < maxlen:
            return text
    return saferepr(obj, maxlen, maxlevels=maxlevels)


def _plain(obj: Any, level: int, maxlevels: int) -> bool:
    kind = type(obj)
    if kind is str:
        return _plain_str(obj)
    if kind in _SCALARS:
        return True
    if kind is not dict and kind is not list and kind is not tuple:
        return False
    if maxlevels and level >= maxlevels:
        return False
    level += 1
    if kind is dict:
        if not all(type(key) is str and _plain_str(key) for key in obj):
            return False
        obj = obj.values()
    # The leaves inline: most values of a job's arguments are strings and numbers.
    for value in obj:
        kind = type(value)
        if kind is str:
            if "'" in value or "\\" in value or not value.isprintable():
                return False
        elif kind not in _SCALARS and not _plain(value, level, maxlevels):
            return False
    return True


def _plain_str(text: str) -> bool:
    return "'" not in text and "\\" not in text and text.isprintable()


_SCALARS = frozenset({int, float, bool, type(None)})


class _Route:
    """What ``send_task`` works out for one task name and set of options."""

    __slots__ = ("declare", "expires", "ignore_result", "options", "soft_time_limit",
                 "task_type", "time_limit")

    def __init__(self, options: dict[str, Any], task_type: Any, time_limit: Any,
                 soft_time_limit: Any, expires: Any, ignore_result: Any,
                 declare: Any) -> None:
        self.options = options
        self.task_type = task_type
        self.time_limit = time_limit
        self.soft_time_limit = soft_time_limit
        self.expires = expires
        self.ignore_result = ignore_result
        self.declare = declare


class _BatchSender:
    """Sends claimed jobs exactly as ``app.send_task`` would, minus its per-call costs.

    ``send_task`` spends most of its time on work that is the same for every
    message of one task: looking up the task's execution options, routing,
    declaring the queue, and ``saferepr`` of the arguments. Here the first
    three are done once per (task, options) per batch, and the reprs use
    :func:`fast_repr`. Each message is still built by
    ``app.amqp.create_task_message`` and sent by ``app.amqp.send_task_message``
    (before/after publish signals, retry policy, delivery mode), so headers,
    properties and body are the ones ``send_task`` produces.

    When the transport buffers the batch (Redis), publishing only appends to a
    pipeline, so kombu's per-message retry wrapper is skipped: it could never
    fire, and a failed flush is reported to the caller either way.
    """

    def __init__(self, app: Any, producer: Any, buffered: bool) -> None:
        self.app = app
        self.amqp = app.amqp
        self.producer = producer
        self.router = self.amqp.router
        conf = app.conf
        # Celery < 5.7 has no task_repr_maxlevels: its as_task_v2 uses saferepr's default, 3.
        self.maxlevels = conf.get("task_repr_maxlevels", 3)
        self.args_maxlen = self.amqp.argsrepr_maxsize
        self.kwargs_maxlen = self.amqp.kwargsrepr_maxsize
        self.reply_to = app.thread_oid
        self.origin = anon_nodename()  # as_task_v2's default, once per batch
        self.retry = conf.task_publish_retry
        self.retry_policy = dict(conf.task_publish_retry_policy or {})
        self.overrides: dict[str, Any] = {"retry": False} if buffered else {}
        self.routes: dict[tuple[Any, ...], _Route] = {}
        self.declared: set[int] = set()
        self.on_task_call = app.backend.on_task_call
        # Dict routes (task_routes mappings) look at the task name only; others may
        # look at the arguments, so their route is worked out per message.
        self.cacheable = all(isinstance(maybe_evaluate(r), MapRoute) for r in self.router.routes)

    @classmethod
    def make(cls, app: Any, producer: Any, buffered: bool) -> _BatchSender | None:
        """A sender, or ``None`` where only ``send_task`` itself is faithful."""
        conf = app.conf
        if (conf.task_send_sent_event or conf.task_protocol != 2
                or app.current_worker_task is not None):
            return None
        return cls(app, producer, buffered)

    def send(self, claimed: Claimed, push: RedisPush | None = None,
             more: Mapping[str, str] | None = None) -> None:
        """Publish ``claimed`` with ``more`` headers; with ``push``, queue it there (built
        from a template when its route has one)."""
        job = claimed.job
        args, kwargs = message_args(claimed)
        name = job.task
        key = (name, job.queue, job.routing_key, job.priority)
        route = self.routes.get(key)
        if route is None:
            options = routing_options(claimed)
            options["headers"] = claimed.headers()
            route = self._route(name, options, args, kwargs)
            if route is None:  # an expiry send_task must convert itself
                if push is None:
                    _send(self.app, self.producer, claimed, more)
                else:
                    push.capture(lambda: _send(self.app, self.producer, claimed, more),
                                 claimed.republished)
                return
            if self.cacheable:  # routes that ignore the arguments
                self.routes[key] = route
        task_id = claimed.task_id
        # as_task_v2 would repr ``args or ()``, ``kwargs or {}``
        message = Message(task_id, args, kwargs,
                          fast_repr(args or (), self.args_maxlen, self.maxlevels),
                          fast_repr(kwargs or {}, self.kwargs_maxlen, self.maxlevels),
                          headers_of(claimed, more))
        if push is None:
            self._publish(route, name, message)
            return
        if not route.ignore_result:
            self.on_task_call(self.producer, task_id)
        # A relative expiry is an absolute time per message: no template.
        template_key = (key, tuple(message.headers)) if self.cacheable and route.expires is None \
            else None
        push.send(template_key, message, lambda: self._publish(route, name, message, False),
                  claimed.republished)

    def _publish(self, route: _Route, name: str, message: Message, on_call: bool = True) -> None:
        """``send_task``'s message creation and publish, for one message."""
        task_id = message.task_id
        options = dict(route.options)
        # Keywords, not positions: as_task_v2's parameter order is not a stable API.
        body = self.amqp.create_task_message(
            task_id, name, message.args, message.kwargs, expires=route.expires, retries=0,
            reply_to=self.reply_to, time_limit=route.time_limit,
            soft_time_limit=route.soft_time_limit, create_sent_event=False,
            origin=self.origin, ignore_result=route.ignore_result, replaced_task_nesting=0,
            argsrepr=message.argsrepr, kwargsrepr=message.kwargsrepr, **options,
        )
        for stamp in options.pop("stamped_headers", None) or ():
            options.pop(stamp)
        options = {**self.overrides, **route.declare, **options, "headers": dict(message.headers)}
        if on_call and not route.ignore_result:
            self.app.backend.on_task_call(self.producer, task_id)
        self.amqp.send_task_message(self.producer, name, body, **options)

    def _route(self, name: str, options: dict[str, Any], args: list[Any],
               kwargs: dict[str, Any]) -> _Route | None:
        """``send_task``'s option handling, for one task and its options."""
        expires_arg = options.pop("expires", _OMITTED)
        task_type = self.app._tasks.get(name) if _SEND_TASK_USES_REGISTRY else None
        get_exec_options = getattr(task_type, "_get_exec_options", None)
        if get_exec_options is not None and inspect.ismethod(get_exec_options):
            filtered = {k: v for k, v in (get_exec_options() or {}).items() if v is not None}
            if filtered:
                options = dict(filtered, **options)
        time_limit = options.pop("time_limit", None)
        soft_time_limit = options.pop("soft_time_limit", None)
        expires = options.pop("expires", None) if expires_arg is _OMITTED else expires_arg
        options.pop("expires", None)
        ignore_result = options.pop("ignore_result", None if _SEND_TASK_USES_REGISTRY else False)
        options = self.router.route(options, name, args, kwargs, task_type)
        options.pop("headers", None)  # each message's own headers are added when sending
        if expires is not None:
            if isinstance(expires, bool) or not isinstance(expires, int | float) or expires < 0:
                return None
            options["expiration"] = expires
        return _Route(options, task_type, time_limit, soft_time_limit, expires, ignore_result,
                      self._declare(options))

    def _declare(self, options: dict[str, Any]) -> dict[str, Any]:
        """Declare the message's queue once per batch, as ``send_task_message`` would per message.

        Returns the ``declare`` argument for ``send_task_message``: empty (its
        default: the queue) when ``options`` route somewhere else.
        """
        if "declare" in options:
            return {}
        queue = options.get("queue")
        if queue is None and options.get("exchange") is None:
            queue = self.amqp.default_queue
        if isinstance(queue, str):
            queue = self.amqp.queues[queue]
        if not queue or isinstance(queue, Broadcast):
            return {}
        if id(queue) not in self.declared:
            # As Producer.publish declares: kombu 5.4 without the retry policy, later ones with it.
            retry = {"retry": self.retry, **self.retry_policy} if _KOMBU_5_5 else {}
            self.producer.maybe_declare(queue, **retry)
            self.declared.add(id(queue))
        return {"declare": []}


_OMITTED = object()


def _release(distribution: str) -> tuple[int, int]:
    """Major and minor version of an installed distribution."""
    match = re.match(r"(\d+)\.(\d+)", metadata.version(distribution))
    return (int(match[1]), int(match[2])) if match else (0, 0)


# Celery 5.7's send_task looks the task up in the app's registry, applies its
# execution options (queue, priority, expires, ...) and leaves an unset
# ignore_result None. Earlier versions do neither and default it to False.
_SEND_TASK_USES_REGISTRY = _release("celery") >= (5, 7)
_KOMBU_5_5 = _release("kombu") >= (5, 5)
