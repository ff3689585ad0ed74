"""Built-in notifiers: a signed JSON webhook (:mod:`.webhook`), and any transport
another integration registers (``celery_zsched.notify_transports``: the Django
app's ``mail``, to ADMINS).

Switched on by settings (``zsched_notify_webhook_url``, ``zsched_notify_mail``),
they listen to the signals named in ``zsched_notify_events``
(:mod:`celery_zsched.signals`). A signal only puts its event on a bounded
in-process queue; a daemon thread per process (started on first use, so a
prefork child starts its own) asks Redis whether the notice may go out and
delivers it. The rate limit (one notice per job or domain and signal per
``zsched_notify_window_s``) and the digest (past ``zsched_notify_digest_threshold``
notices in a ``zsched_notify_digest_window_s`` window, the rest wait for one
digest) live in Redis, so they hold across every worker, child and beat; the
digest of a window is claimed atomically by exactly one of them. Beat, workers
and ``zsched serve`` start and stop them through
:mod:`celery_zsched.services.extensions`.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery_zsched.config import SETTING_PREFIX, Settings
from celery_zsched.core.errors import ConfigurationError, StoreUnavailable
from celery_zsched.core.results import NoticeGate
from celery_zsched.notify.webhook import (
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    VERIFY_TOLERANCE_S,
    DeliveryFailed,
    Webhook,
    signature,
    verify,
)
from celery_zsched.services import extensions
from celery_zsched.services.appstore import store_for_app
from celery_zsched.services.notices import Message, Transport
from celery_zsched.services.signals import SIGNALS, Event
from celery_zsched.store import Store

__all__ = ["EVENT_HEADER", "SIGNATURE_HEADER", "TIMESTAMP_HEADER", "VERIFY_TOLERANCE_S",
           "DeliveryFailed", "Message", "Notifier", "Transport", "Webhook", "close_all",
           "install", "signature", "uninstall", "verify"]

logger = logging.getLogger("celery_zsched")

#: Notices a digest carries in full (its count stays exact).
DIGEST_CAP = 100
#: Longest a process waits at exit for its queued notices to go out.
FLUSH_WAIT_S = 5.0
#: A digest is claimed this long after its window ends (Redis' and this host's
#: clocks tick at slightly different rates).
_FLUSH_SLACK_S = 0.05
#: After Redis failed a flush, try again this much later.
_FLUSH_RETRY_S = 5.0



@dataclass
class NotifierStats:
    """What one process's notifier did (for logs and tests)."""

    queued: int = 0
    dropped: int = 0
    limited: int = 0
    held: int = 0
    sent: int = 0
    digests: int = 0
    failed: int = 0
    by_transport: dict[str, int] = field(default_factory=dict)


_STOP = object()


class Notifier:
    """Receives signals, and delivers what the shared rate limit and digest let through.

    :meth:`receive` never blocks: it puts the event on a bounded queue (a full
    queue drops it, counted and logged). The sender thread starts on the
    first event in each process, so one built before a fork works in the child.
    """

    def __init__(self, settings: Settings, store: Callable[[], Store],
                 transports: Sequence[Transport]) -> None:
        self.settings = settings
        self._store = store
        self.transports = list(transports)
        self.stats = NotifierStats()
        self._connected: list[tuple[str, Any]] = []
        self._reset()

    def _reset(self) -> None:
        # Also run in a forked child: the parent's thread, queue and lock did not
        # come along in a usable state.
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue(self.settings.notify_queue_size)
        self._thread: threading.Thread | None = None
        self._flush_at: float | None = None

    # ------------------------------------------------------------ signals
    def connect(self, sender: Any = None) -> None:
        """Receive the signals of ``zsched_notify_events`` sent by ``sender`` (None: any)."""
        for name in self.settings.notify_event_names:
            uid = f"celery_zsched.notify.{id(self)}.{name}"
            SIGNALS[name].connect(self.receive, sender=sender, weak=False, dispatch_uid=uid)
            self._connected.append((name, sender))

    def disconnect(self) -> None:
        """Stop receiving signals."""
        for name, sender in self._connected:
            SIGNALS[name].disconnect(self.receive, sender=sender,
                                     dispatch_uid=f"celery_zsched.notify.{id(self)}.{name}")
        self._connected.clear()

    def receive(self, signal: Any = None, sender: Any = None, event: Event | None = None,
                **_: Any) -> None:
        """The signal receiver: queue ``event`` for the sender thread."""
        if event is not None:
            self.enqueue(event)

    def enqueue(self, event: Event) -> bool:
        """Queue ``event``; False (and counted) when the queue is full."""
        if os.getpid() != self._pid:
            self._reset()
        self._start()
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.stats.dropped += 1
            if self.stats.dropped == 1 or self.stats.dropped % 100 == 0:
                logger.warning("zsched: notification queue full (%d); %d notices dropped",
                               self.settings.notify_queue_size, self.stats.dropped)
            return False
        self.stats.queued += 1
        return True

    def _start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="zsched-notify",
                                                daemon=True)
                self._thread.start()

    def close(self, timeout: float = FLUSH_WAIT_S) -> bool:
        """Deliver what is queued, waiting ``timeout`` at most; True when all went out."""
        thread = self._thread
        if os.getpid() != self._pid or thread is None or not thread.is_alive():
            return True
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            return False
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            logger.warning("zsched: %d notices not delivered at exit", self._queue.qsize())
            return False
        return True

    # ------------------------------------------------------ sender thread
    def _run(self) -> None:
        while True:
            wait = None if self._flush_at is None else max(0.0, self._flush_at - time.monotonic())
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                self._guarded(self._flush)
                continue
            if item is _STOP:
                return
            self._guarded(functools.partial(self._handle, item))

    def _guarded(self, step: Callable[[], None]) -> None:
        try:
            step()
        except StoreUnavailable as exc:
            logger.warning("zsched: notification dropped, Redis unavailable: %s", exc)
            if self._flush_at is not None:
                self._flush_at = time.monotonic() + _FLUSH_RETRY_S
        except Exception:
            logger.exception("zsched: notifier failed")

    def _gate(self, subject: str = "", notice: str = "", event: str = "") -> NoticeGate:
        s = self.settings
        return self._store().notice_gate(
            subject, notice, event, window_ms=round(s.notify_window_s * 1000),
            digest_ms=round(s.notify_digest_window_s * 1000),
            threshold=s.notify_digest_threshold, cap=DIGEST_CAP)

    def _handle(self, event: Event) -> None:
        gate = self._gate(f"{event.event}|{event.subject}",
                          json.dumps(event.to_dict(), separators=(",", ":")), event.event)
        self._after(gate)
        if gate.verdict == "send":
            self._deliver(Message.notice(event))
        elif gate.verdict == "held":
            self.stats.held += 1
        else:
            self.stats.limited += 1

    def _flush(self) -> None:
        self._flush_at = None
        self._after(self._gate())

    def _after(self, gate: NoticeGate) -> None:
        """Send a digest the call claimed; be back when the open window ends."""
        if gate.digest is not None:
            self.stats.digests += 1
            self._deliver(Message.digest(gate.digest))
        if gate.open_until_ms is not None:
            self._flush_at = (time.monotonic() + (gate.open_until_ms - gate.now_ms) / 1000
                              + _FLUSH_SLACK_S)

    def _deliver(self, message: Message) -> None:
        for transport in self.transports:
            try:
                transport.send(message)
            except Exception as exc:
                self.stats.failed += 1
                logger.warning("zsched: %s notification %s not delivered: %s",
                               transport.name, message.event, exc)
            else:
                self.stats.sent += 1
                self.stats.by_transport[transport.name] = (
                    self.stats.by_transport.get(transport.name, 0) + 1)


# --------------------------------------------------------------- per app
_lock = threading.Lock()
_notifiers: dict[int, Notifier] = {}
_hooks_registered = False


def transports_for(settings: Settings) -> list[Transport]:
    """The transports ``settings`` switch on."""
    out: list[Transport] = []
    if settings.notify_webhook_url:
        out.append(Webhook(settings.notify_webhook_url, settings.notify_webhook_secret,
                           settings.notify_webhook_timeout_s, settings.notify_webhook_retries))
    if settings.notify_mail:
        # Registered by the Django app (an entry point): this package's core
        # never imports Django.
        try:
            admin_mail = extensions.notify_transport("mail")
        except ConfigurationError as exc:
            raise ConfigurationError(f"{SETTING_PREFIX}notify_mail: {exc}") from exc
        out.append(admin_mail())
    return out


def install(app: Any) -> Notifier | None:
    """Connect the notifiers ``app``'s settings switch on (idempotent; None when none is).

    Workers call it at start-up, beat when it sets up. Raises
    :class:`~celery_zsched.core.errors.ConfigurationError` naming a bad setting.
    """
    global _hooks_registered
    settings = Settings.from_app(app)
    if not settings.notify_on:
        return None
    with _lock:
        notifier = _notifiers.get(id(app))
        if notifier is None:
            notifier = Notifier(settings, lambda: store_for_app(app), transports_for(settings))
            notifier.connect(sender=app)
            _notifiers[id(app)] = notifier
        if not _hooks_registered:
            atexit.register(close_all)
            _hooks_registered = True
        return notifier


def uninstall(app: Any) -> None:
    """Disconnect and close ``app``'s notifier (tests, or an app being torn down)."""
    with _lock:
        notifier = _notifiers.pop(id(app), None)
    if notifier is not None:
        notifier.disconnect()
        notifier.close()


def close_all(timeout: float = FLUSH_WAIT_S) -> None:
    """Deliver every queued notice of this process, waiting ``timeout`` at most in all."""
    deadline = time.monotonic() + timeout
    with _lock:
        notifiers = list(_notifiers.values())
    for notifier in notifiers:
        notifier.close(max(0.0, deadline - time.monotonic()))


class _Extension:
    """The notifiers as an extension (:mod:`celery_zsched.services.extensions`): installed
    where beat, a worker or ``zsched serve`` starts, flushed where each stops."""

    def start(self, app: Any, role: str) -> None:
        install(app)

    def stop(self, role: str) -> None:
        close_all()


#: Registered under the ``celery_zsched.extensions`` entry point group.
EXTENSION = _Extension()
