"""The HTTP server (``zsched serve``): tokens, the job gateway and the connection limits."""

from __future__ import annotations

from dataclasses import dataclass

from celery_zsched.config.load import SETTING_PREFIX, check_not_negative, check_positive
from celery_zsched.core.errors import ConfigurationError

#: What a bearer token may do: ``read`` and ``write`` the management API, or
#: take and report jobs through the gateway (``worker``).
SCOPES = ("read", "write", "worker")
#: Shortest token accepted: a short one is guessable whatever the comparison.
MIN_TOKEN_CHARS = 16


@dataclass(frozen=True)
class ServerSettings:
    """What ``zsched serve`` accepts, from whom, and how long it waits."""

    #: Bearer tokens of the HTTP server (``zsched serve``): comma-separated
    #: ``token:scope`` pairs, scope ``read``, ``write`` or ``worker`` (the job
    #: gateway). Empty: no token, so every request is refused.
    api_tokens: str = ""
    #: Longest a ``GET /jobs/next`` long-poll waits for a due job before ``204``.
    gateway_timeout_s: float = 30.0
    #: Execution lease of a job the gateway hands out: unreported (no complete,
    #: error or heartbeat) for this long, it comes back, as from a dead worker.
    gateway_lease_s: float = 60.0
    #: Key of the gateway's lease tokens (an HMAC of job, occurrence and attempt):
    #: the same on every server of a deployment, required once a worker token is set.
    gateway_lease_secret: str = ""
    #: The lease secret before the last rotation: still accepted for one lease period
    #: after the server starts, so leases handed out before a rotation can be reported.
    gateway_lease_secret_previous: str = ""
    #: Most long-polls (``GET /jobs/next``) waiting at once; past it ``503`` with
    #: Retry-After. 0: half of the connection cap.
    gateway_max_polls: int = 0
    #: Most open HTTP connections of ``zsched serve``; past it the oldest idle one
    #: is closed, or the new one answered ``503``. 0: the process's soft fd limit
    #: minus a reserve (store connections, files), so accept() never runs out of fds.
    http_max_connections: int = 0
    #: Seconds a connection may take to send a request's headers (from its opening,
    #: or from the end of the previous answer); then it is closed.
    http_header_timeout_s: float = 10.0
    #: Longest pause, in seconds, between two reads of a request body; then the
    #: connection is closed.
    http_body_timeout_s: float = 30.0
    #: Seconds an idle keep-alive connection is kept open after an answer.
    http_keepalive_s: float = 5.0

    def _check_server(self) -> None:
        check_positive(self, "gateway_timeout_s", "gateway_lease_s", "http_header_timeout_s",
                       "http_body_timeout_s", "http_keepalive_s")
        check_not_negative(self, "gateway_max_polls", "http_max_connections")
        api_token_scopes(self.api_tokens)


def api_token_scopes(raw: str) -> dict[str, str]:
    """``zsched_api_tokens`` as token -> scope; :class:`ConfigurationError` names a bad entry."""
    out: dict[str, str] = {}
    for n, entry in enumerate(raw.split(","), 1):
        entry = entry.strip()
        if not entry:
            continue
        token, sep, scope = entry.rpartition(":")
        token, scope = token.strip(), scope.strip().lower()
        if not sep or scope not in SCOPES:
            raise ConfigurationError(
                f"{SETTING_PREFIX}api_tokens entry {n} must be token:scope with scope one of "
                f"{', '.join(SCOPES)}")
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigurationError(
                f"{SETTING_PREFIX}api_tokens entry {n}: a token must be at least "
                f"{MIN_TOKEN_CHARS} characters")
        out[token] = scope
    return out
