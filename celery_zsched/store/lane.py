"""Script calls sent now whose replies are read later: round trips off the worker's path.

A worker that runs tasks back to back settles one and starts the next. The
settle is sent the moment the task is done, so Redis applies it then, exactly
as a waited-for call; only reading its reply waits, until the process's next
start (whose own round trip the reply has long arrived by) or a short timer.
The task slot never sits out a round trip for it, and the next start, sent on
the same connection behind it (:meth:`Lane.call`), reads both replies at once:
one read per execution on one connection, as the floor of ``benchmarks/cycle.py``
has it. Likewise a worker's main process sends the holds of the messages it
receives (those received within a few milliseconds together, in one call:
:mod:`celery_zsched.worker.heartbeat`), and reads the reply when it accepts a
message, before acknowledging it.

Replies come back in the order the calls were sent, over one connection per
process, checked out of the client's pool while replies are unread and given
back once they are all read (a prefork pool process keeps it: :attr:`Lane.keep`):
no other caller ever gets a connection with a reply left on it. A connection
that breaks takes its unread replies with it: their receivers are handed
``None`` (make the call the usual way), never a reply read off the next one.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from redis.commands.core import Script
from redis.exceptions import ResponseError

try:
    import hiredis
except ImportError:  # a dependency, but a broken install must still work
    hiredis = None  # type: ignore[assignment]


#: Whether :func:`packed_evalsha` can be had (hiredis is installed).
PACKS = hiredis is not None


def packed_evalsha(sha: str, keys: Sequence[str], args: Sequence[Any]) -> bytes:
    """``EVALSHA sha`` with ``keys`` and ``args`` in Redis' protocol, packed by hiredis in
    one call (only when :data:`PACKS`): redis-py's packer walks every argument in
    Python first (a worker's settle has about 30)."""
    packed: bytes = hiredis.pack_command(("EVALSHA", sha, len(keys), *keys, *args))
    return packed


def send_evalsha(conn: Any, sha: str, keys: Sequence[str], args: Sequence[Any], *,
                 check_health: bool = True) -> None:
    """Send ``EVALSHA sha`` with ``keys`` and ``args`` on ``conn``, packed by hiredis
    where it is installed."""
    if not PACKS:
        conn.send_command("EVALSHA", sha, len(keys), *keys, *args, check_health=check_health)
        return
    conn.send_packed_command([packed_evalsha(sha, keys, args)], check_health=check_health)


#: What a sent call's reply is handed to: the raw reply, or ``None`` when there
#: is none (the connection broke, Redis answered an error): the caller decides.
OnReply = Callable[[Any], None]


def _mine(reply: Any) -> None:
    """The receiver :meth:`Lane.call` marks its own reply with (never called)."""


class Lane:
    """One connection of ``pool`` carrying script calls whose replies are read later."""

    def __init__(self, pool: Any, get_connection: Callable[[Any], Any]) -> None:
        self._pool = pool
        self._get = get_connection
        self._lock = threading.Lock()
        self._conn: Any = None
        self._pending: deque[OnReply] = deque()
        #: Receivers whose replies went with a broken connection, to be handed ``None``.
        self._lost: list[tuple[OnReply, Any]] = []
        #: Keep the connection checked out once every reply is read (a pool process,
        #: whose every execution sends on the lane): no checkout per execution.
        self.keep = False
        _lanes.add(self)

    @property
    def pending(self) -> int:
        """How many replies are unread (or lost with a connection, not handed over yet)."""
        return len(self._pending) + len(self._lost)

    def send(self, script: Script, keys: Sequence[str], args: Sequence[Any],
             on_reply: OnReply) -> None:
        """Send ``script`` now; ``on_reply`` gets its reply from :meth:`collect`.

        Raises redis-py's connection errors when the call could not be sent (the
        caller then makes it the usual way); nothing is pending then.
        """
        with self._lock:
            self._send(script, keys, args, on_reply)

    def call(self, script: Script, keys: Sequence[str], args: Sequence[Any]
             ) -> tuple[Any, list[tuple[OnReply, Any]]] | None:
        """Send ``script`` behind the calls whose replies are unread, and read them all,
        its own last: its reply (``None``: none could be had) and the earlier replies
        with their receivers, for the caller to hand over.

        Only while no other thread uses the lane (a prefork child's, whose only
        other user is its timer): else ``None`` at once, and the caller makes the
        call the usual way, on a connection of its own, instead of waiting for
        the other thread's round trip. Raises as :meth:`send` does.
        """
        if not self._lock.acquire(blocking=False):
            return None
        try:
            self._send(script, keys, args, _mine)
            replies = self._read()
        finally:
            self._lock.release()
        _, mine = replies.pop()  # read last, as it was sent last
        return mine, replies

    def collect(self) -> list[tuple[OnReply, Any]]:
        """Read every unread reply; returns each with its receiver, in the order sent,
        for the caller to hand over (outside this lane's lock)."""
        with self._lock:
            return self._read()

    def _send(self, script: Script, keys: Sequence[str], args: Sequence[Any],
              on_reply: OnReply) -> None:
        # Under the lock.
        if self._conn is None:
            self._conn = self._get(self._pool)
        try:
            # A health check PING would read a pending reply: only on an idle connection.
            send_evalsha(self._conn, script.sha, keys, args, check_health=not self._pending)
        except BaseException:
            self._drop()
            raise
        self._pending.append(on_reply)

    def _read(self) -> list[tuple[OnReply, Any]]:
        # Under the lock. The connection goes back to the pool once every reply is read
        # (unless the lane keeps it).
        out, self._lost = self._lost, []
        while self._pending:
            on_reply = self._pending.popleft()
            try:
                reply = self._conn.read_response()
            except ResponseError:
                # An error reply (a script a fresh server does not know): the
                # stream is intact; the caller makes this call the usual way.
                reply = None
            except Exception:
                # The rest are lost with the connection: each caller decides.
                out.append((on_reply, None))
                out.extend((rest, None) for rest in self._pending)
                self._pending.clear()
                self._drop()
                break
            out.append((on_reply, reply))
        if self._conn is not None and not self._pending and not self.keep:
            self._pool.release(self._conn)
            self._conn = None
        return out

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.disconnect()  # a reply may be left unread: never reuse it
            self._pool.release(self._conn)
            self._conn = None
        # The replies still unread went with the connection. Handed over as lost by
        # the next read, they never wait on the next connection for replies it will
        # not carry, nor take the replies of the calls sent on it.
        self._lost.extend((on_reply, None) for on_reply in self._pending)
        self._pending.clear()

    def _forget_after_fork(self) -> None:
        # A forked child must not read its parent's socket: it starts empty. Its lock
        # starts free too: another thread of the parent may have held it at the fork.
        self._lock = threading.Lock()
        self._conn = None
        self._pending.clear()
        self._lost = []


#: Every lane of this process, to be emptied in a forked child (:func:`_after_fork`).
_lanes: weakref.WeakSet[Lane] = weakref.WeakSet()


def _after_fork() -> None:
    # Once per fork, not an ``os.getpid()`` per call: a system call on every send.
    for lane in list(_lanes):
        lane._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork)
