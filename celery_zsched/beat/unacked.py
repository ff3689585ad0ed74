"""Beat's sweep of a Redis broker's unacked index: what a dead worker took unrecorded.

kombu's Redis transport keeps every message a consumer took and has not
acknowledged in an ``unacked`` hash, indexed by when it was taken, and puts it
back in its queue only after the visibility timeout (an hour by default). A
worker records what it holds with its heartbeat (every third of a lease); a
message it took and died with before that beat is recorded nowhere else. Once
such an entry is a lease old, and its occurrence is still queued for exactly
that publish with no worker holding it, its worker is dead (a live one would
have recorded its hold by then): ``rescue.lua`` makes it due again at once,
with the same task id. kombu's own restore an hour later finds it settled and
is dropped at start.

A worker can also die with a message the broker no longer has anywhere:
kombu takes it with BRPOP and records it in the unacked index only after it
has read the reply, so a worker killed in between (the reply unread while its
loop handled another message) takes it along. Nothing names that message, so
the sweep infers it from the order of the broker's lists, which are first in,
first out for first deliveries, a republished occurrence going to the front
(``lost.lua``): once a later first delivery of the same list has started,
or the list was seen empty, and a lease has passed, a still-queued occurrence
that no worker holds was taken by a worker that died. It is made due again the
same way.

Only kombu's Redis transport keeps such an index. RabbitMQ requeues a dead
consumer's unacknowledged messages the moment its connection closes. The
entries' times are the consuming host's clock (kombu stamps them so): a
worker host whose clock runs ahead delays the rescue by that much.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from kombu.transport import redis as kombu_redis

from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.store import Store, every_line_of

logger = logging.getLogger("celery_zsched")

#: Entries read per page, and pages per sweep (a beat starting on a broker full
#: of entries works through them over several sweeps).
PAGE = 1000
PAGES = 10
#: Most slack between a claim and the push of its message (see ``slack_ms``).
SLACK_S = 1.0


def occurrence_in(raw: bytes | str | None) -> tuple[str, int, int, int] | None:
    """(id, occurrence, attempt, delivery) of a zsched message as kombu keeps it unacked
    (``[message, exchange, routing key]``); ``None`` for any other entry."""
    try:
        message = json.loads(raw or "null")[0]
        headers = message.get("headers") or {}
        job_id, occurrence = headers.get("zsched_job_id"), headers.get("zsched_occurrence")
        attempt, delivery = headers.get("zsched_attempt"), headers.get("zsched_delivery", 1)
    except (ValueError, TypeError, IndexError, AttributeError, KeyError):
        return None
    # type() rather than isinstance(): a bool or a float is no count.
    if not isinstance(job_id, str) or type(occurrence) is not int \
            or type(attempt) is not int or type(delivery) is not int:
        return None
    return job_id, occurrence, attempt, delivery


class UnackedSweep:
    """Reads the broker's unacked index forward from where it last stopped."""

    def __init__(self, app: Any, store: Store,
                 queues: Callable[[], Iterable[str | None]] = tuple) -> None:
        self.app = app
        self.store = store
        #: The queues this beat publishes to (their lists are watched for emptiness).
        self.queues = queues
        self.every_s = store.settings.heartbeat_s
        self._next = 0.0
        self._cursor = float("-inf")
        self._connection: Any = None
        #: (monotonic time, marks) of recent sweeps: marks are applied a lease later.
        self._marks: deque[tuple[float, dict[str, int]]] = deque()
        #: False once the broker turned out not to keep such an index.
        self.enabled = True

    def due(self) -> bool:
        """Whether a sweep is due (every heartbeat period)."""
        return self.enabled and time.monotonic() >= self._next

    def sweep(self) -> int:
        """One sweep; the number of occurrences made due again. Broker and store errors
        are logged and retried at the next sweep: nothing here is urgent."""
        self._next = time.monotonic() + self.every_s
        try:
            return self._sweep()
        except StoreUnavailable as exc:
            logger.warning("zsched: unacked sweep skipped: %s", exc)
        except Exception as exc:  # the broker, or kombu, out of reach: try again later
            logger.warning("zsched: unacked sweep skipped (broker: %s)", exc)
            self.close()
        return 0

    def _sweep(self) -> int:
        channel = self._channel()
        if channel is None:
            return 0
        client, index, table = channel.client, channel.unacked_index_key, channel.unacked_key
        # A lease old: a live worker records its hold within a third of that.
        ceiling = time.time() - self.store.settings.lease_s
        rescued = 0
        for _ in range(PAGES):
            low = "-inf" if self._cursor == float("-inf") else f"({self._cursor!r}"
            page = client.zrangebyscore(index, low, ceiling, start=0, num=PAGE, withscores=True)
            if not page:
                break
            tags = [tag for tag, _score in page]
            taken = [found for raw in client.hmget(table, tags)
                     if (found := occurrence_in(raw)) is not None]
            ids = self.store.rescue(taken)
            rescued += len(ids)
            if ids:
                logger.warning("zsched: %d message(s) a dead worker took unrecorded are due "
                               "again: %s", len(ids), ", ".join(ids[:20]))
            self._cursor = float(page[-1][1])
            if len(page) < PAGE:
                break
        return rescued + self._lost(channel)

    def _lost(self, channel: Any) -> int:
        """Make due again what workers took from the lists and died with unrecorded."""
        marks = self._marks_now(channel)
        self._marks.append((time.monotonic(), marks))
        # Marks a lease old: a live worker that took any message behind them has
        # recorded its hold since (every heartbeat, a third of a lease).
        ripe: dict[str, int] | None = None
        horizon = time.monotonic() - self.store.settings.lease_s
        while self._marks and self._marks[0][0] <= horizon:
            ripe = self._marks.popleft()[1]
        if ripe is None:
            return 0
        # Put back the sample applied, so it is not lost when no newer one ripens.
        self._marks.appendleft((horizon, ripe))
        ids = self.store.rescue_lost(ripe, slack_ms=self.slack_ms)
        if ids:
            logger.warning("zsched: %d message(s) a dead worker took from the broker before "
                           "it recorded them are due again: %s", len(ids), ", ".join(ids[:20]))
        return len(ids)

    @property
    def slack_ms(self) -> int:
        """How much earlier than a mark an occurrence must have been promoted to be judged
        by it: beats that push out of claim order (several beats, one stalled between
        claim and push) by less than this are never taken for lost; by more, their
        message is published twice and the start runs one."""
        return int(min(SLACK_S, self.store.settings.heartbeat_s) * 1000)

    def _marks_now(self, channel: Any) -> dict[str, int]:
        """Per list, the promotion time before which its messages have all been taken:
        the latest a start saw, and now for a queue whose lists are all empty while a
        live worker consumes it."""
        # Redis' time first: a list seen empty after it held nothing pushed before it.
        now_ms = self.store.now_ms()
        marks = self.store.received_marks()
        queues = sorted({line.rpartition("\x1f")[0] for line in marks}
                        | {str(q) for q in self.queues() if q is not None})
        steps = list(getattr(channel, "priority_steps", None) or [0])
        pipe = channel.client.pipeline(transaction=False)
        for queue in queues:
            for step in steps:
                pipe.llen(channel._q_for_pri(queue, step))
        lengths = pipe.execute()
        empty = [queue for k, queue in enumerate(queues)
                 if not any(lengths[k * len(steps):(k + 1) * len(steps)])]
        # Emptied by a worker, not by the broker losing them: only while one consumes.
        for queue in self.store.consumed(empty):
            marks[every_line_of(queue)] = now_ms
        return marks

    def _channel(self) -> Any:
        if self._connection is None:
            self._connection = self.app.connection_for_read()
        if not isinstance(self._connection.transport, kombu_redis.Transport):
            self.enabled = False
            self.close()
            return None
        return self._connection.default_channel

    def close(self) -> None:
        """Release the broker connection (reopened at the next sweep)."""
        if self._connection is not None:
            try:
                self._connection.release()
            except Exception:  # closing what may already be broken
                logger.debug("zsched: closing the sweep's broker connection failed",
                             exc_info=True)
            self._connection = None
