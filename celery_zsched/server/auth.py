"""Bearer tokens from ``zsched_api_tokens``, each scoped to read, write or worker.

No token, no access: a request without a known token gets ``401``; a known
token outside its scope gets ``403``. Tokens are compared as SHA-256 digests
with :func:`hmac.compare_digest`, against every configured token without
stopping at a match, so neither the time taken nor its length says how much
of a guess was right.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Mapping

from fastapi import Request

from celery_zsched.server.problems import Problem

#: What each scope also grants: a write token may read. The worker scope (the
#: gateway) is its own: a worker token cannot read or edit other jobs.
IMPLIES: dict[str, frozenset[str]] = {
    "read": frozenset({"read"}),
    "write": frozenset({"read", "write"}),
    "worker": frozenset({"worker"}),
}


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class Tokens:
    """The configured tokens (kept as digests) and what each may do."""

    def __init__(self, scopes: Mapping[str, str]) -> None:
        self._entries = [(_digest(token), scope) for token, scope in scopes.items()]

    def scope_of(self, token: str) -> str | None:
        """The scope of ``token``, or ``None``; constant time in the token's content."""
        offered = _digest(token)
        found: str | None = None
        for digest, scope in self._entries:
            # No early exit: every comparison runs whichever one matches.
            if hmac.compare_digest(offered, digest):
                found = scope
        return found

    def check(self, authorization: str | None, needed: str | None) -> str:
        """The scope of an ``Authorization`` header that grants ``needed`` (``None``: any
        known token will do); else a Problem."""
        token = bearer_token(authorization)
        if token is None:
            raise Problem(401, "unauthorized", "send Authorization: Bearer <token>",
                          headers={"WWW-Authenticate": "Bearer"})
        scope = self.scope_of(token)
        if scope is None:
            raise Problem(401, "unauthorized", "unknown token",
                          headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
        if needed is not None and needed not in IMPLIES[scope]:
            raise Problem(403, "forbidden", f"this token's scope is {scope}; this needs {needed}")
        return scope


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer`` header, however it is spelled (the
    scheme in any case, spaces around the token); ``None`` if it holds none."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def require(needed: str | None) -> Callable[[Request], Awaitable[str]]:
    """A FastAPI dependency: the request's token must grant ``needed`` (``None``: any scope)."""
    async def dependency(request: Request) -> str:
        tokens: Tokens = request.app.state.tokens
        return tokens.check(request.headers.get("authorization"), needed)
    return dependency


def token_identity(request: Request) -> str:
    """Who the request's token is: the hex SHA-256 of the token itself, the same for
    every spelling of its header (Idempotency-Key scopes, audit names)."""
    return _digest(bearer_token(request.headers.get("authorization")) or "").hex()


def token_fingerprint(request: Request) -> str:
    """A name for the request's token that does not reveal it: 12 hex digits of its
    SHA-256 (what the audit trail records as who made an API change)."""
    return token_identity(request)[:12]
