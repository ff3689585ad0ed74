"""Script calls sent now whose replies are read later: round trips off the worker's path.

A worker that runs tasks back to back settles one and starts the next. The
settle is sent the moment the task is done, so Redis applies it then, exactly
as a waited-for call; only reading its reply waits, until the process's next
start (whose own round trip the reply has long arrived by) or a short timer.
The task slot never sits out a round trip for it, and the next start, sent on
the same connection behind it, reads both replies at once. Likewise a worker's
main process sends the hold of each message it receives at once, and reads the
reply when it accepts the message, before acknowledging it.

Replies come back in the order the calls were sent, over one connection per
process, checked out of the client's pool for as long as the process uses the
lane (given back closed only when it breaks): no other caller ever gets a
connection with a reply left on it, and the hot path never checks one out.
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


def send_evalsha(conn: Any, sha: str, keys: Sequence[str], args: Sequence[Any], *,
                 check_health: bool = True) -> None:
    """Send ``EVALSHA sha`` with ``keys`` and ``args`` on ``conn``, packed by hiredis in
    one call: redis-py's packer walks every argument in Python first, which costs a
    worker's settle (about 30 arguments) as much client CPU as its script's work."""
    if hiredis is None:
        conn.send_command("EVALSHA", sha, len(keys), *keys, *args, check_health=check_health)
        return
    conn.send_packed_command([hiredis.pack_command(("EVALSHA", sha, len(keys), *keys, *args))],
                             check_health=check_health)


#: What a sent call's reply is handed to: the raw reply, or ``None`` when there
#: is none (the connection broke, Redis answered an error): the caller decides.
OnReply = Callable[[Any], None]


def _mine(reply: Any) -> None:
    """The receiver :meth:`Lane.call` marks its own reply with (never called)."""


_MINE: OnReply = _mine


class Lane:
    """One connection of ``pool`` carrying script calls whose replies are read later."""

    def __init__(self, pool: Any, get_connection: Callable[[Any], Any]) -> None:
        self._pool = pool
        self._get = get_connection
        self._lock = threading.Lock()
        self._conn: Any = None
        self._pending: deque[OnReply] = deque()
        _lanes.add(self)

    @property
    def pending(self) -> int:
        """How many replies are unread."""
        return len(self._pending)

    def send(self, script: Script, keys: Sequence[str], args: Sequence[Any],
             on_reply: OnReply) -> None:
        """Send ``script`` now; ``on_reply`` gets its reply from :meth:`collect`.

        Raises redis-py's connection errors when the call could not be sent (the
        caller then makes it the usual way); nothing is pending then.
        """
        with self._lock:
            if self._conn is None:
                self._conn = self._get(self._pool)
            try:
                # A health check PING would read a pending reply: only on an idle connection.
                send_evalsha(self._conn, script.sha, keys, args, check_health=not self._pending)
            except BaseException:
                self._drop()
                raise
            self._pending.append(on_reply)

    def call(self, script: Script, keys: Sequence[str], args: Sequence[Any]
             ) -> tuple[Any, list[tuple[OnReply, Any]]]:
        """Send ``script`` now and read every reply up to its own: its reply (``None``:
        none could be had), and the earlier replies with their receivers, for the
        caller to hand over. Read under the lock, so no other thread's
        :meth:`collect` can take this call's reply. Raises as :meth:`send` does."""
        with self._lock:
            if self._conn is None:
                self._conn = self._get(self._pool)
            try:
                send_evalsha(self._conn, script.sha, keys, args, check_health=not self._pending)
            except BaseException:
                self._drop()
                raise
            self._pending.append(_MINE)
            replies = self._read()
        mine = next(reply for on_reply, reply in replies if on_reply is _MINE)
        return mine, [(on_reply, reply) for on_reply, reply in replies if on_reply is not _MINE]

    def collect(self) -> list[tuple[OnReply, Any]]:
        """Read every unread reply; returns each with its receiver, in the order sent,
        for the caller to hand over (outside this lane's lock)."""
        with self._lock:
            return self._read()

    def _read(self) -> list[tuple[OnReply, Any]]:
        # Under the lock. The connection stays checked out once its replies are read:
        # the process's next call needs it, and nobody else gets it with a reply left.
        out: list[tuple[OnReply, Any]] = []
        if self._conn is None:  # a send broke the connection: the earlier replies with it
            out.extend((on_reply, None) for on_reply in self._pending)
            self._pending.clear()
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
        return out

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.disconnect()  # a reply may be left unread: never reuse it
            self._pool.release(self._conn)
            self._conn = None

    def _forget(self) -> None:
        # In a forked child: it must not read its parent's socket, nor wait on a lock
        # one of the parent's threads held at the fork. It starts empty.
        self._lock = threading.Lock()
        self._conn = None
        self._pending.clear()


#: Every lane of this process, emptied in a forked child (a hook, not a pid check
#: on every call: ``os.getpid`` is a system call, and the hot path makes several).
_lanes: weakref.WeakSet[Lane] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for lane in list(_lanes):
        lane._forget()


os.register_at_fork(after_in_child=_forget_after_fork)
