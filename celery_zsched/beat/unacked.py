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

Only kombu's Redis transport keeps such an index. RabbitMQ requeues a dead
consumer's unacknowledged messages the moment its connection closes. The
entries' times are the consuming host's clock (kombu stamps them so): a
worker host whose clock runs ahead delays the rescue by that much.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from kombu.transport import redis as kombu_redis

from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.store import Store

logger = logging.getLogger("celery_zsched")

#: Entries read per page, and pages per sweep (a beat starting on a broker full
#: of entries works through them over several sweeps).
PAGE = 1000
PAGES = 10


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

    def __init__(self, app: Any, store: Store) -> None:
        self.app = app
        self.store = store
        self.every_s = store.settings.heartbeat_s
        self._next = 0.0
        self._cursor = float("-inf")
        self._connection: Any = None
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
        return rescued

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
