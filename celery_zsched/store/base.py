"""The store's foundation: its client and partitions, the layout check, and how every
script and pipeline reaches Redis (one partition, a pipeline over several, or a
stream of chunks)."""

from __future__ import annotations

import functools
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

from redis.commands.core import Script
from redis.exceptions import NoScriptError

from celery_zsched.config import Settings
from celery_zsched.core.errors import LayoutMismatch
from celery_zsched.core.job import Defaults
from celery_zsched.store import scripts
from celery_zsched.store.connection import is_cluster, redis_client
from celery_zsched.store.errors import redis_unavailable
from celery_zsched.store.keys import Keys, partition_of
from celery_zsched.store.lane import Lane, send_evalsha
from celery_zsched.store.placement import Layout
from celery_zsched.store.scripts import ScriptSpec

P = ParamSpec("P")


R = TypeVar("R")


T = TypeVar("T")
S = TypeVar("S", bound="StoreBase")


def unavailable(fn: Callable[P, R]) -> Callable[P, R]:
    """A store operation: Redis errors become ``StoreUnavailable``, and the
    store's partition layout is checked against the settings before the first one."""
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with redis_unavailable():
            store = args[0]
            assert isinstance(store, StoreBase)
            if not store.layout_checked:
                store.check_layout()
            return fn(*args, **kwargs)
    return wrapper


#: An execution a worker keeps alive: (id, occurrence, attempt[, fence]).
Running = tuple[str, int, int] | tuple[str, int, int, int]


#: A message a worker received and holds: (id, occurrence, attempt, delivery, task).
Held = tuple[str, int, int, int, str]


#: A script call for :meth:`Store._run`: spec, partition keys, rows, named args.
Call = tuple["ScriptSpec[Any]", Keys, Sequence[Sequence[Any]], Mapping[str, Any]]


def time_ms(reply: Sequence[Any]) -> int:
    """Epoch ms of a Redis ``TIME`` reply (seconds, microseconds)."""
    sec, usec = reply
    return int(sec) * 1000 + int(usec) // 1000


def first(row: Sequence[Any]) -> str:
    """The job id of a script row (always its first value)."""
    return str(row[0])


def pooled_connection(pool: Any) -> Any:
    """A connection of ``pool``, on every redis-py this package admits."""
    try:
        return pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants a command name
        return pool.get_connection("EVALSHA")


class ScriptStream:
    """Calls one script over one connection, sending a call before the previous reply is read.

    With at most two calls in flight, Redis executes one chunk of a bulk
    upsert while Python builds the next: the two overlap instead of taking
    turns. Replies come back in order. Clients without a single connection
    pool run each call synchronously instead; on Redis Cluster, each partition
    streams over the connection pool of the node that holds its slot.
    """

    def __init__(self, client: Any, script: Script, keys: Sequence[str]) -> None:
        self.script = script
        self.keys = list(keys)
        self.pool: Any = getattr(client, "connection_pool", None)
        if is_cluster(client):
            # The pool of the node that serves this partition's slot.
            node = client.get_node_from_key(self.keys[0])
            connection = node.redis_connection if node is not None else None
            self.pool = connection.connection_pool if connection is not None else None
        self.conn: Any = None
        self.in_flight: list[int] = []  # row counts of the calls awaiting their reply

    def __enter__(self) -> ScriptStream:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.conn is not None:
            if self.in_flight:  # replies left unread: the connection cannot be reused
                self.conn.disconnect()
            self.pool.release(self.conn)
            self.conn = None

    def call(self, args: Sequence[Any], rows: int) -> list[tuple[int, Any]]:
        """Send one call; returns the (rows, reply) of calls that had to be read first."""
        if self.pool is None:
            return [(rows, self.script(keys=self.keys, args=list(args)))]
        if self.conn is None:
            self.conn = pooled_connection(self.pool)
        # EVAL, not EVALSHA: no NOSCRIPT to recover from mid-stream. A health
        # check PING would read a pending reply, so only check an idle connection.
        self.conn.send_command("EVAL", self.script.script, len(self.keys), *self.keys, *args,
                               check_health=not self.in_flight)
        self.in_flight.append(rows)
        return self.drain(keep=1)

    def drain(self, keep: int = 0) -> list[tuple[int, Any]]:
        """Read replies until at most ``keep`` calls are in flight."""
        out = []
        while len(self.in_flight) > keep:
            reply = self.conn.read_response()
            out.append((self.in_flight.pop(0), reply))
        return out


class StoreBase:
    """What every part of the store stands on: the client, the settings, the partitions
    and their keys, the layout check, and the ways scripts are called."""

    def __init__(self, client: Any, settings: Settings | None = None,
                 timezone: str = "UTC") -> None:
        self.client = client
        self.settings = settings or Settings()
        #: Keys on the base prefix (the layout record lives there).
        self.base = Keys.for_prefix(self.settings.key_prefix)
        #: Each partition's keys; where a job lives is :attr:`layout`'s rule.
        self.parts = self.base.partitions(self.settings.partitions)
        #: The partition count and placement rule (recorded on the base prefix).
        self.layout = Layout.of(self.settings)
        #: Partitions of ids learned from message headers (see :meth:`learn`).
        self._hints: dict[str, int] = {}
        #: The first partition's keys (the only ones in a one-partition store).
        self.keys = self.parts[0]
        self.defaults = Defaults.from_settings(self.settings, timezone)
        self.rng = random.Random()
        self.layout_checked = False
        #: The partition the gateway's next claim starts at (see :meth:`claim_http`).
        self._http_cursor = 0
        #: What the pacing-aware scripts read: the settings as JSON, or "" (off).
        self.pacing = (self.settings.pacing_defaults.to_json()
                       if self.settings.pacing else "")
        self._scripts: dict[str, Script] = {
            name: client.register_script(scripts.source(name)) for name in scripts.SCRIPTS
        }
        pool = getattr(client, "connection_pool", None)
        #: Where a worker's settles go ahead of their replies (``None`` on a Cluster).
        self.lane = (Lane(pool, pooled_connection)
                     if pool is not None and not is_cluster(client) else None)

    @classmethod
    def from_settings(cls: type[S], settings: Settings, timezone: str = "UTC") -> S:
        """A store on ``settings.redis_url`` (connects lazily, on first use)."""
        return cls(redis_client(settings), settings, timezone)

    # ----------------------------------------------------------------- basics
    @unavailable
    def now_ms(self) -> int:
        """The Redis server's clock, in epoch ms."""
        return time_ms(self.client.time())

    @property
    def partitions(self) -> int:
        """How many partitions this store has (``zsched_partitions``)."""
        return len(self.parts)

    def part_of(self, job_id: str) -> Keys:
        """The keys of the partition that holds ``job_id``."""
        return self.parts[self.locate([job_id])[job_id]]

    def domain_keys(self, domain: str) -> Keys:
        """The keys of the partition that holds ``domain``'s pacing state."""
        return self.parts[self.layout.domain_home(domain)]

    def id_part(self, job_id: str) -> int:
        """The partition of ``job_id``'s own hash: where its directory entry lives."""
        return partition_of(job_id, len(self.parts))

    def learn(self, job_id: str, part: int) -> None:
        """Remember that ``job_id`` is in partition ``part`` (a message header said so):
        a worker's start, heartbeat and settle then skip the directory. Forgotten
        at its settle; a job moves only while nothing of it is in flight."""
        if 0 <= part < len(self.parts):
            if len(self._hints) >= 65536:
                self._hints.clear()
            self._hints[job_id] = part

    def learn_header(self, job_id: str, value: str | None) -> None:
        """:meth:`learn` from a ``zsched_partition`` header (``"index@layout"``), if it was
        written under this store's layout (else the directory decides)."""
        if not value or not self.layout.by_domain:
            return
        index, _, layout = value.partition("@")
        if layout == str(self.layout) and index.isdigit():
            self.learn(job_id, int(index))

    def forget(self, job_id: str) -> None:
        """Drop what :meth:`learn` remembered of ``job_id``."""
        self._hints.pop(job_id, None)

    def locate(self, ids: Iterable[str]) -> dict[str, int]:
        """The partition index of each id: its own by id; by domain, its directory
        entry when it has one (one pipeline over the ids' own partitions)."""
        count = len(self.parts)
        out = {job_id: partition_of(job_id, count) for job_id in ids}
        if not self.layout.by_domain:
            return out
        hints = self._hints
        ask: dict[int, list[str]] = defaultdict(list)
        for job_id, own in out.items():
            hinted = hints.get(job_id)
            if hinted is not None:
                out[job_id] = hinted
            else:
                ask[own].append(job_id)
        if ask:
            pipe = self.client.pipeline(transaction=False)
            for own, members in ask.items():
                pipe.hmget(self.parts[own].directory, members)
            for members, found in zip(ask.values(), pipe.execute(), strict=True):
                for job_id, part in zip(members, found, strict=True):
                    if part is not None and 0 <= int(part) < count:
                        out[job_id] = int(part)
        return out

    def group(self, items: Iterable[T], id_of: Callable[[T], str] = str
              ) -> dict[int, list[T]]:
        """``items`` by the partition index of their job id (``id_of(item)``), in
        their given order within each."""
        items = list(items)
        where = self.locate(id_of(item) for item in items)
        out: dict[int, list[T]] = defaultdict(list)
        for item in items:
            out[where[id_of(item)]].append(item)
        return out

    def check_layout(self) -> None:
        """Raise :class:`LayoutMismatch` unless the store has this process's layout:
        ``zsched_partitions`` partitions, placed by the rule the pacing settings ask for.

        A store without a layout record has one partition, unless it is empty:
        a fresh store takes the configured layout (recorded on first check).
        """
        configured = str(self.layout)
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.base.layout)
        pipe.hlen(self.base.defs)
        recorded, base_jobs = pipe.execute()
        if recorded is None:
            if configured == "1":
                self.layout_checked = True
                return
            if base_jobs:
                recorded = "1"
            else:
                self.client.set(self.base.layout, configured, nx=True)
                recorded = self.client.get(self.base.layout) or configured
        recorded = str(recorded)
        if recorded.startswith("moving:"):
            _, old, new = recorded.split(":")
            raise LayoutMismatch(
                f"the store under {self.base.prefix} is being repartitioned from {old} to "
                f"{new} partitions (zsched repartition); waiting for it to finish")
        if recorded != configured:
            have = Layout.parse(recorded)
            if have.rule == self.layout.rule:
                raise LayoutMismatch(
                    f"the store under {self.base.prefix} has {have.count} partitions but "
                    f"zsched_partitions is {self.layout.count}: set zsched_partitions="
                    f"{have.count}, or run `zsched repartition --to {self.layout.count}` "
                    "with beat and workers stopped")
            fix = (f"set zsched_partitions={have.count}, zsched_pacing and "
                   "zsched_domain_registrable as the store has them")
            raise LayoutMismatch(
                f"the store under {self.base.prefix} has {have.describe()} but this "
                f"process's settings ask for {self.layout.describe()}: {fix}, or run "
                f"`zsched repartition --to {self.layout.count}` with these settings and "
                "beat and workers stopped")
        self.layout_checked = True

    def _call(self, spec: ScriptSpec[R], keys: Keys, rows: Iterable[Sequence[Any]] = (),
              **args: Any) -> R:
        """Run ``spec`` on partition ``keys`` with its named ``args`` (and ``rows``); parse it."""
        return spec.reply(self._scripts[spec.name](keys=spec.key_names(keys),
                                                   args=spec.argv(args, rows)))

    def _call_hot(self, spec: ScriptSpec[R], keys: Keys, rows: Sequence[Sequence[Any]] = (),
                  **args: Any) -> R:
        """:meth:`_call` for the worker's start, hold and settle, once each per execution:
        straight on a pooled connection, without redis-py's per-command machinery
        (it costs about as much client CPU as the round trip itself). A Cluster
        client goes the usual way (it routes by slot and follows MOVED)."""
        pool = getattr(self.client, "connection_pool", None)
        if pool is None or is_cluster(self.client):
            return self._call(spec, keys, rows, **args)
        script = self._scripts[spec.name]
        names = spec.key_names(keys)
        argv = spec.argv(args, rows)
        conn = pooled_connection(pool)
        try:
            send_evalsha(conn, script.sha, names, argv)
            try:
                reply = conn.read_response()
            except NoScriptError:  # a fresh or restarted server: load it, as Script does
                conn.send_command("EVAL", script.script, len(names), *names, *argv)
                reply = conn.read_response()
        except BaseException:
            conn.disconnect()  # a reply may be left unread: never reuse it
            raise
        finally:
            pool.release(conn)
        return spec.reply(reply)

    def _run(self, calls: Sequence[Call]) -> list[Any]:
        """Run several script calls in one pipeline (one round trip per Redis node).

        EVALSHA straight into the pipeline: no SCRIPT EXISTS round trip first.
        A node that does not know a script yet (a fresh or promoted one) answers
        NOSCRIPT without running it, so just those calls are run again, loading it.
        Replies are raw, in the order of ``calls``.
        """
        if len(calls) == 1:
            spec, keys, rows, args = calls[0]
            return [self._scripts[spec.name](keys=spec.key_names(keys),
                                             args=spec.argv(args, rows))]
        pipe = self.client.pipeline(transaction=False)
        cluster = is_cluster(self.client)
        for spec, keys, rows, args in calls:
            names = spec.key_names(keys)
            # execute_command, not pipe.evalsha(): redis-py's ClusterPipeline blocks
            # the evalsha method. On a Cluster, name the node of the partition's
            # slot: left to find the keys itself, the pipeline asks a node
            # COMMAND GETKEYS for every script call first, one round trip each.
            # (A MOVED reply after a failover is still followed.)
            options = {"target_nodes": self.client.get_node_from_key(names[0])} if cluster else {}
            pipe.execute_command("EVALSHA", self._scripts[spec.name].sha, len(names), *names,
                                 *spec.argv(args, rows), **options)
        return self._script_replies(calls, pipe.execute(raise_on_error=False))

    def _script_replies(self, calls: Sequence[Call], replies: Sequence[Any]) -> list[Any]:
        """The replies of ``calls`` sent as EVALSHA without raising: a script the server
        did not know is run again by name (loading it, as redis-py's Script does); any
        other error is raised."""
        out = []
        for (spec, keys, rows, args), reply in zip(calls, replies, strict=True):
            if isinstance(reply, NoScriptError):
                reply = self._scripts[spec.name](keys=spec.key_names(keys),
                                                 args=spec.argv(args, rows))
            elif isinstance(reply, Exception):
                raise reply
            out.append(reply)
        return out

    def _pipeline_each(self, commands: Callable[[Any, Keys], None]) -> list[list[Any]]:
        """Queue ``commands(pipe, keys)`` for every partition; the replies, per partition."""
        pipe = self.client.pipeline(transaction=False)
        sizes = []
        for keys in self.parts:
            before = len(pipe)
            commands(pipe, keys)
            sizes.append(len(pipe) - before)
        replies = pipe.execute()
        out, at = [], 0
        for size in sizes:
            out.append(replies[at:at + size])
            at += size
        return out

    def _by_job(self, spec: ScriptSpec[Any], rows: Sequence[Sequence[Any]],
                **args: Any) -> list[Any]:
        """Run ``spec`` once per partition over the ``rows`` (id first) it holds."""
        calls: list[Call] = [(spec, self.parts[i], part_rows, args)
                             for i, part_rows in self.group(rows, first).items()]
        return [spec.reply(reply) for reply in self._run(calls)] if calls else []

    @unavailable
    def per_job(self, ids: Sequence[str], command: Callable[[Any, Keys, list[str]], None]
                ) -> list[Any]:
        """One value per id, in one pipeline: ``command(pipe, keys, members)`` queues one
        command per partition that answers a list, one value per member (ZMSCORE,
        SMISMEMBER, HMGET)."""
        if not ids:
            return []
        groups = self.group(ids)
        pipe = self.client.pipeline(transaction=False)
        for part, members in groups.items():
            command(pipe, self.parts[part], members)
        found = {job_id: value
                 for members, values in zip(groups.values(), pipe.execute(), strict=True)
                 for job_id, value in zip(members, values, strict=True)}
        return [found[job_id] for job_id in ids]
