"""Every Redis key name is built here, from one configurable prefix."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "{zsched}:"


@dataclass(frozen=True)
class Keys:
    """The Redis keys of one store.

    The prefix carries a Redis Cluster hash tag, so every Lua script touches
    keys of a single slot.
    """

    prefix: str = DEFAULT_PREFIX

    @classmethod
    def for_prefix(cls, prefix: str) -> Keys:
        """Keys under ``prefix``; a prefix without a hash tag gets one."""
        if "{" not in prefix or "}" not in prefix:
            prefix = "{" + prefix.rstrip(":") + "}:"
        return cls(prefix)

    def _k(self, name: str) -> str:
        return self.prefix + name

    @property
    def defs(self) -> str:
        """Hash: job id -> definition JSON."""
        return self._k("defs")

    @property
    def schedule(self) -> str:
        """Sorted set: job id -> due time (ms)."""
        return self._k("schedule")

    @property
    def queued(self) -> str:
        """Sorted set: job id -> delivery deadline (ms) while published and not started."""
        return self._k("queued")

    @property
    def leases(self) -> str:
        """Sorted set: job id -> execution lease deadline (ms) while running."""
        return self._k("leases")

    @property
    def workers(self) -> str:
        """Sorted set: worker name -> its last heartbeat (ms)."""
        return self._k("workers")

    @property
    def state(self) -> str:
        """Hash: job id -> runtime state (cjson)."""
        return self._k("state")

    @property
    def paused(self) -> str:
        """Set of paused job ids."""
        return self._k("paused")

    @property
    def dead(self) -> str:
        """Sorted set: dead-lettered job id -> time it died (ms)."""
        return self._k("dead")

    @property
    def static(self) -> str:
        """Set of job ids that came from the ``beat_schedule`` setting."""
        return self._k("static")

    @property
    def events(self) -> str:
        """Capped stream of settles, for run history."""
        return self._k("events")

    @property
    def counters(self) -> str:
        """Hash of global counters (promoted, complete, error, reaped, dead)."""
        return self._k("counters")

    @property
    def drain_cursor(self) -> str:
        """String: id of the last settle event copied into the Django run history."""
        return self._k("drain_cursor")

    def all(self) -> list[str]:
        """Every key of the store (for tests and wiping a throwaway store)."""
        return [
            self.defs, self.schedule, self.queued, self.leases, self.state, self.paused,
            self.dead, self.static, self.events, self.counters, self.drain_cursor,
            self.workers,
        ]
