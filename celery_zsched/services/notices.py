"""What a notifier delivers, and to what: the interface between the notifiers
(:mod:`celery_zsched.notify`) and the transports other integrations provide
(Django's ``mail_admins``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from celery_zsched.services.signals import Event


@dataclass(frozen=True)
class Message:
    """One delivery: a single notice, or the digest of a window."""

    #: The signal's name, or ``digest``.
    event: str
    body: dict[str, Any]

    @classmethod
    def notice(cls, event: Event) -> Message:
        """The message of one signal's event."""
        return cls(event.event, event.to_dict())

    @classmethod
    def digest(cls, digest: dict[str, Any]) -> Message:
        """The message of a claimed digest (``notify.lua``'s fields)."""
        return cls("digest", {"event": "digest", **digest})

    @property
    def title(self) -> str:
        """A one-line summary (a mail subject)."""
        body = self.body
        if self.event == "digest":
            seconds = (body["end_ms"] - body["start_ms"]) / 1000
            kinds = ", ".join(f"{n} {k}" for k, n in sorted(body["by_event"].items()))
            return f"{body['count']} more notices in {seconds:g} s ({kinds})"
        if self.event == "domain_breaker_opened":
            return f"domain_breaker_opened: {body['domain']}"
        return f"{self.event}: {body.get('name') or body.get('url') or body['job_id']}"

    def to_json(self) -> bytes:
        """The JSON body a webhook posts (compact, keys sorted)."""
        return json.dumps(self.body, separators=(",", ":"), sort_keys=True).encode()


class Transport(Protocol):
    """Delivers a message, or raises."""

    name: str

    def send(self, message: Message) -> None:
        """Deliver ``message``; raise when it could not be delivered."""
