"""The lease token a worker echoes back: which hand-out of which occurrence it holds.

``<occurrence>.<attempt>.<fence>.<signature>``, the signature an HMAC of the
job id, occurrence, attempt and fence under a key derived from the server's
settings. The fence numbers the hand-out (every claim of the occurrence gets a
greater one), so a worker whose lease lapsed, and whose job was reaped or handed
to another worker, holds a token the store no longer honours: its heartbeat and
reports change nothing. The worker treats the token as opaque. The signature
ties it to one job: a token of another job (or a made-up one) is refused
before the store is asked, so no answer says anything about a job the caller
was not given.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass

_TOKEN = re.compile(r"^(\d{1,16})\.(\d{1,9})\.(\d{1,12})\.([A-Za-z0-9_-]{22})\Z")


@dataclass(frozen=True)
class Lease:
    """One hand-out of one occurrence and attempt of one job."""

    job_id: str
    occurrence: int
    attempt: int
    #: The hand-out's number (the store's fence): only the latest one holds the job.
    fence: int


class LeaseSigner:
    """Makes and checks lease tokens under one key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def for_settings(cls, key_prefix: str, api_tokens: str) -> LeaseSigner:
        """A signer every server of one store and one token set agrees on."""
        material = f"celery-zsched lease\0{key_prefix}\0{api_tokens}".encode()
        return cls(hashlib.sha256(material).digest())

    def _signature(self, job_id: str, occurrence: int, attempt: int, fence: int) -> str:
        mac = hmac.new(self._key, f"{job_id}\0{occurrence}\0{attempt}\0{fence}".encode(),
                       hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac[:16]).decode().rstrip("=")

    def token(self, lease: Lease) -> str:
        """The token of ``lease``."""
        sig = self._signature(lease.job_id, lease.occurrence, lease.attempt, lease.fence)
        return f"{lease.occurrence}.{lease.attempt}.{lease.fence}.{sig}"

    def read(self, job_id: str, token: str) -> Lease | None:
        """The lease ``token`` holds on job ``job_id``, or ``None`` if it is not one."""
        match = _TOKEN.match(token)
        if not match:
            return None
        occurrence, attempt, fence = int(match[1]), int(match[2]), int(match[3])
        if not hmac.compare_digest(match[4], self._signature(job_id, occurrence, attempt, fence)):
            return None
        return Lease(job_id, occurrence, attempt, fence)
