"""Named interfaces between the front ends and what hooks into them.

Beat, the workers and ``zsched serve`` never import the notifiers or the
metrics (nor the notifiers Django's mail): they meet here. An extension is
registered under the ``celery_zsched.extensions`` entry point group of a
distribution's metadata (this package registers its notifiers and its beat
metrics so), and is called at each process's start and stop; one may also
observe beat's ticks. A notifier transport is registered under
``celery_zsched.notify_transports`` by name (``mail``: Django's
``mail_admins``), and built when the settings switch it on.

Entry points are looked up once per process; one that fails to load is logged
and skipped, so a broken extension never stops a beat or a worker.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import entry_points
from typing import Any, Protocol

from celery_zsched.config import Settings
from celery_zsched.core.errors import ConfigurationError
from celery_zsched.core.results import Claimed

logger = logging.getLogger("celery_zsched")

EXTENSIONS = "celery_zsched.extensions"
NOTIFY_TRANSPORTS = "celery_zsched.notify_transports"
#: The processes an extension hears of: beat, a worker's main process, a worker's
#: pool process (stop only), and the HTTP server.
ROLES = ("beat", "worker", "worker_process", "serve")


class BeatObserver(Protocol):
    """What beat tells about its ticks (its metrics)."""

    def time_claim(self) -> contextlib.AbstractContextManager[None]:
        """Around a tick's claim."""

    def time_publish(self) -> contextlib.AbstractContextManager[None]:
        """Around a tick's publish."""

    def tick(self, claimed: Sequence[Claimed], promoted: int) -> None:
        """A tick that reached Redis: what it claimed, how many it published."""

    def failure(self) -> None:
        """A tick that failed: Redis or the broker unreachable."""


class Extension(Protocol):
    """What the ``celery_zsched.extensions`` entry points name (each method optional)."""

    def start(self, app: Any, role: str) -> None:
        """A process of ``role`` starts with Celery app ``app``."""

    def stop(self, role: str) -> None:
        """A process of ``role`` stops (or a pool process of a worker exits)."""

    def beat_observer(self, settings: Settings) -> BeatObserver | None:
        """An observer of beat's ticks, or ``None``."""


@functools.cache
def extensions() -> tuple[Any, ...]:
    """The registered extensions, loaded once per process."""
    found = []
    for point in entry_points(group=EXTENSIONS):
        try:
            found.append(point.load())
        except Exception:  # a broken extension must not stop beat or a worker
            logger.exception("zsched: extension %s could not be loaded", point.name)
    return tuple(found)


def start(app: Any, role: str) -> None:
    """Tell every extension that a process of ``role`` starts.

    A :class:`ConfigurationError` (a bad setting) stops the process: it is the
    user's to fix. Any other failure is logged.
    """
    for extension in extensions():
        _call(extension, "start", app, role)


def stop(role: str) -> None:
    """Tell every extension that a process of ``role`` stops."""
    for extension in extensions():
        _call(extension, "stop", role)


def _call(extension: Any, name: str, *args: Any) -> Any:
    method = getattr(extension, name, None)
    if method is None:
        return None
    try:
        return method(*args)
    except ConfigurationError:
        raise
    except Exception:
        logger.exception("zsched: extension %r failed in %s", extension, name)
        return None


class _Observers:
    """Every extension's observer as one (none: a no-op)."""

    def __init__(self, observers: Sequence[BeatObserver]) -> None:
        self.observers = observers

    @contextlib.contextmanager
    def time_claim(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for observer in self.observers:
                stack.enter_context(observer.time_claim())
            yield

    @contextlib.contextmanager
    def time_publish(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for observer in self.observers:
                stack.enter_context(observer.time_publish())
            yield

    def tick(self, claimed: Sequence[Claimed], promoted: int) -> None:
        for observer in self.observers:
            observer.tick(claimed, promoted)

    def failure(self) -> None:
        for observer in self.observers:
            observer.failure()


def beat_observer(settings: Settings) -> BeatObserver:
    """The observers of beat's ticks the extensions provide, as one."""
    found = [observer for extension in extensions()
             if (observer := _call(extension, "beat_observer", settings)) is not None]
    return _Observers(found)


def notify_transport(name: str) -> Callable[[], Any]:
    """The factory of notifier transport ``name``; :class:`ConfigurationError` when none
    is registered, or it cannot be loaded (its integration is not installed)."""
    for point in entry_points(group=NOTIFY_TRANSPORTS, name=name):
        try:
            factory: Callable[[], Any] = point.load()
        except ImportError as exc:
            raise ConfigurationError(
                f"notifier transport {name!r} cannot be loaded ({exc}): is its integration "
                "installed (for mail: pip install 'celery-zsched[django]')?") from exc
        return factory
    raise ConfigurationError(f"no notifier transport {name!r} is registered")
