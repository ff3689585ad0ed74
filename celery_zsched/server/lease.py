"""The lease token a worker echoes back: which occurrence and attempt it holds.

``<occurrence>.<attempt>.<signature>``, the signature an HMAC of the job id,
occurrence and attempt under a key derived from the server's settings. The
worker treats it as opaque. The signature ties it to one job: a token of
another job (or a made-up one) is refused before the store is asked, so no
answer says anything about a job the caller was not given.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass

_TOKEN = re.compile(r"^(\d{1,16})\.(\d{1,9})\.([A-Za-z0-9_-]{22})\Z")


@dataclass(frozen=True)
class Lease:
    """One occurrence and attempt of one job, as handed out."""

    job_id: str
    occurrence: int
    attempt: int


class LeaseSigner:
    """Makes and checks lease tokens under one key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def for_settings(cls, key_prefix: str, api_tokens: str) -> LeaseSigner:
        """A signer every server of one store and one token set agrees on."""
        material = f"celery-zsched lease\0{key_prefix}\0{api_tokens}".encode()
        return cls(hashlib.sha256(material).digest())

    def _signature(self, job_id: str, occurrence: int, attempt: int) -> str:
        mac = hmac.new(self._key, f"{job_id}\0{occurrence}\0{attempt}".encode(),
                       hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac[:16]).decode().rstrip("=")

    def token(self, lease: Lease) -> str:
        """The token of ``lease``."""
        sig = self._signature(lease.job_id, lease.occurrence, lease.attempt)
        return f"{lease.occurrence}.{lease.attempt}.{sig}"

    def read(self, job_id: str, token: str) -> Lease | None:
        """The lease ``token`` holds on job ``job_id``, or ``None`` if it is not one."""
        match = _TOKEN.match(token)
        if not match:
            return None
        occurrence, attempt = int(match[1]), int(match[2])
        if not hmac.compare_digest(match[3], self._signature(job_id, occurrence, attempt)):
            return None
        return Lease(job_id, occurrence, attempt)
