"""The worker's main process holds the messages it received and has not started.

A held occurrence is republished one lease after its worker dies, not after
the broker's visibility timeout (Redis, SQS) nor the 2 h delivery deadline.

Two moments need a hold:

- *Received* (``task_received``): on a broker that keeps a dead consumer's
  unacknowledged messages until a visibility timeout (kombu's virtual
  transports), the prefetched message is held from the next heartbeat on; a
  message younger than one beat is found in the broker's unacked index by
  beat's sweep (:mod:`celery_zsched.beat.unacked`). RabbitMQ requeues a dead
  connection's messages at once and needs no hold here.
- *Accepted* (``Request.on_accepted``): a task without ``acks_late`` is
  acknowledged the moment a pool process accepts it, before that process has
  run the start compare-and-set. Killed in between, the message is gone from
  every broker and the occurrence is not running: nothing but a hold
  names it. So the hold is recorded in Redis before the acknowledgement. Where
  the receipt holds already (a Redis broker), it is sent then (the holds of
  the messages received within ``HOLD_SOON_S`` after it with it, in one script
  call), and the acceptance only reads its reply, which has long come back: no
  round trip waited for. Else (RabbitMQ, or no reply) one round trip records it, and with
  it every message received and not recorded yet.
"""

from __future__ import annotations

import os
from typing import Any

from celery.worker.request import Request
from kombu.transport import virtual

from celery_zsched.services.appstore import store_for_app
from celery_zsched.store import Held
from celery_zsched.worker.headers import Occurrence, occurrence_or_none
from celery_zsched.worker.heartbeat import heartbeat_for


def held_row(occ: Occurrence, request: Any) -> Held:
    """The hold of ``request``'s message: (id, occurrence, attempt, delivery, task)."""
    task = str(getattr(request, "name", "") or getattr(request, "task_name", ""))
    delivery = occ.delivery if occ.delivery is not None else 1
    return (occ.job_id, occ.occurrence, occ.attempt, delivery, task)


def on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    """The worker received a message: hold it from the next heartbeat until it starts,
    on a broker that keeps a dead consumer's unacknowledged messages."""
    occ = occurrence_or_none(request)
    if occ is None or not _broker_keeps_unacked(sender):
        return
    app = getattr(sender, "app", None) or request.task.app
    store_for_app(app).learn_header(occ.job_id, occ.partition)
    # A task acknowledged as it is accepted needs its hold recorded by then: sent
    # now (with those received in the next HOLD_SOON_S, one call for all), its reply
    # is read at the acceptance, which so waits for no round trip.
    hub = getattr(sender, "hub", None)
    heartbeat_for(app, store_for_app(app)).hold(
        request, held_row(occ, request), worker_name(getattr(sender, "hostname", None)),
        record=not getattr(request.task, "acks_late", True),
        later=None if hub is None else hub.call_later)


def hold_before_ack(request: Any) -> None:
    """``request`` is about to be acknowledged before it starts: make sure Redis holds it."""
    occ = occurrence_or_none(request)
    if occ is None:
        return
    app = request.task.app
    store_for_app(app).learn_header(occ.job_id, occ.partition)
    heartbeat_for(app, store_for_app(app)).hold_now(request, held_row(occ, request),
                                                    worker_name(request.hostname))


def holding_request(base: type[Request]) -> type[Request]:
    """``base`` (a task's ``Request`` class), whose acknowledgement on acceptance waits
    for the hold (the class itself when it does so already)."""
    if getattr(base, "zsched_holds", False):
        return base

    def on_accepted(self: Request, pid: Any, time_accepted: float) -> None:
        if not self.task.acks_late:
            hold_before_ack(self)
        base.on_accepted(self, pid, time_accepted)

    return type(f"ZSched{base.__name__}", (base,), {
        "on_accepted": on_accepted, "zsched_holds": True, "__module__": __name__})


def _broker_keeps_unacked(consumer: Any) -> bool:
    transport = getattr(getattr(consumer, "connection", None), "transport", None)
    return isinstance(transport, virtual.Transport)


def worker_name(hostname: str | None) -> str:
    """This worker process, as the store's ``workers`` set and holds name it."""
    return f"{hostname or 'worker'}:{_pid[0]}"


#: This process's pid, renewed in a forked child: ``os.getpid`` is a system call,
#: and the main process names itself on every message it receives.
_pid = [os.getpid()]


def _renew_pid() -> None:
    _pid[0] = os.getpid()


os.register_at_fork(after_in_child=_renew_pid)
