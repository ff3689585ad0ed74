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

The key is a secret of its own (``zsched_gateway_lease_secret``, with the key
prefix), not the API tokens: every server of a deployment agrees on it whatever
order its tokens are listed in, a token change leaves the leases in flight alone,
and holding a worker token does not let anyone mint a lease. A server that hands
out HTTP jobs (a ``worker`` token is configured) refuses to start without it.
Rotation: set the new secret and move the old one to
``zsched_gateway_lease_secret_previous``; a restarted server signs with the new
one and accepts the old one for one lease period (``zsched_gateway_lease_s``),
so every lease handed out before the restart can still be reported.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from celery_zsched.config import SETTING_PREFIX, Settings, api_token_scopes
from celery_zsched.core.errors import ConfigurationError

#: Shortest lease secret accepted: 32 characters of token_urlsafe carry 192 bits.
MIN_SECRET_CHARS = 32
# ASCII digits only: \d also matches other scripts' digits, which int() reads.
_TOKEN = re.compile(r"^([0-9]{1,16})\.([0-9]{1,9})\.([0-9]{1,12})\.([A-Za-z0-9_-]{22})\Z")


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
    def for_settings(cls, settings: Settings, key_prefix: str, *,
                     clock: Callable[[], float] = time.monotonic) -> LeaseSigner:
        """The signer of ``zsched_gateway_lease_secret`` for the store under ``key_prefix``.

        Raises :class:`ConfigurationError` when a ``worker`` token is configured (the
        server hands out HTTP jobs) and the secret is missing or short; the message
        carries a freshly generated one to set. Without a worker token no lease is
        ever handed out, and a random key of this process does. With
        ``zsched_gateway_lease_secret_previous``, leases signed with it are accepted
        for ``zsched_gateway_lease_s`` from now (on ``clock``).
        """
        secret, previous = settings.gateway_lease_secret, settings.gateway_lease_secret_previous
        serves_jobs = "worker" in api_token_scopes(settings.api_tokens).values()
        for name, value in (("gateway_lease_secret", secret),
                            ("gateway_lease_secret_previous", previous)):
            if value and len(value) < MIN_SECRET_CHARS:
                raise ConfigurationError(
                    f"{SETTING_PREFIX}{name} must be at least {MIN_SECRET_CHARS} characters")
        if not secret:
            if serves_jobs or previous:
                raise ConfigurationError(
                    f"{SETTING_PREFIX}gateway_lease_secret is required to hand out HTTP jobs "
                    "(a worker token is configured): set the same secret on every server, "
                    f"e.g. ZSCHED_GATEWAY_LEASE_SECRET={secrets.token_urlsafe(32)}")
            return cls(secrets.token_bytes(32))
        signer = cls(_derive(secret, key_prefix))
        if previous and previous != secret:
            until = clock() + settings.gateway_lease_s
            return _Rotating(signer._key, cls(_derive(previous, key_prefix)),
                             lambda: clock() < until)
        return signer

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


def _derive(secret: str, key_prefix: str) -> bytes:
    # Per store: a lease of one store is no lease of another sharing the secret.
    return hmac.new(secret.encode("utf-8", "surrogatepass"),
                    f"celery-zsched lease\0{key_prefix}".encode("utf-8", "surrogatepass"),
                    hashlib.sha256).digest()


class _Rotating(LeaseSigner):
    """Signs with the current key; also reads tokens of the previous key while ``valid()``."""

    def __init__(self, key: bytes, previous: LeaseSigner, valid: Callable[[], bool]) -> None:
        super().__init__(key)
        self._previous, self._valid = previous, valid

    def read(self, job_id: str, token: str) -> Lease | None:
        lease = super().read(job_id, token)
        if lease is None and self._valid():
            lease = self._previous.read(job_id, token)
        return lease
