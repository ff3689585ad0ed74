"""robots.txt: what a fetch's answer means (RFC 9309), and the rules of a body.

No network and no Redis here: :mod:`celery_zsched.services.robots` fetches and
caches, this module decides. The parser is Scrapy's ``protego`` (the ``robots``
extra) when it is installed, which follows RFC 9309 and Google's conventions
(longest match wins, ``*`` and ``$`` in paths); else the standard library's
``urllib.robotparser``, which matches by prefix and in file order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

#: What a fetch of robots.txt found, in the cache's words.
#: ``rules``: a body to obey; ``allow``: none (4xx: RFC 9309 2.3.1.3, "unavailable",
#: crawl anything); ``deny``: unreachable (5xx, 429, network error, too many
#: redirects... RFC 9309 2.3.1.4: assume complete disallow).
KINDS = ("rules", "allow", "deny")

#: RFC 9309 2.3.1.2: follow at least five consecutive redirects.
MAX_REDIRECTS = 5


def kind_of_status(status: int) -> str:
    """The cache kind of an HTTP answer to ``GET /robots.txt`` (after redirects).

    2xx: ``rules``. 3xx (still a redirect after five): ``allow`` (RFC 9309
    2.3.1.2: "unavailable"). 4xx: ``allow`` (RFC 9309 2.3.1.3), except 429, which
    says "slow down", not "no file": ``deny``, as Google does. 5xx and anything
    else: ``deny``.
    """
    if 200 <= status < 300:
        return "rules"
    if 300 <= status < 400 or (400 <= status < 500 and status != 429):
        return "allow"
    return "deny"


def origin_of(url: str) -> str | None:
    """``scheme://host[:port]`` of an http(s) URL: robots.txt applies per origin
    (RFC 9309 2.3), so ``a.example`` and ``b.example`` have their own."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not host:
        return None
    if ":" in host:
        host = f"[{host}]"
    default = {"http": 80, "https": 443}[parts.scheme]
    netloc = host if port in (None, default) else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, "", "", ""))


def robots_url(origin: str) -> str:
    """Where the robots.txt of ``origin`` is."""
    return origin + "/robots.txt"


def bounded_text(body: bytes, max_bytes: int) -> str:
    """The first ``max_bytes`` of ``body`` as text: a cut line is dropped (it could
    be a rule cut short, ``Disallow: /private`` read as ``Disallow: /pri``), a
    byte-order mark is skipped and bytes that are not UTF-8 are replaced."""
    if len(body) > max_bytes:
        body = body[:max_bytes]
        cut = body.rfind(b"\n")
        body = body[:cut + 1] if cut >= 0 else b""
    return body.decode("utf-8-sig", errors="replace")


class _Parser(Protocol):
    def can_fetch(self, url: str, user_agent: str) -> bool: ...


@dataclass(frozen=True)
class Entry:
    """One origin's robots.txt as the cache holds it (times on Redis' clock, ms)."""

    kind: str
    #: The body read (``rules`` only), at most ``zsched_robots_max_bytes``.
    body: str
    fetched_ms: int
    expires_ms: int
    #: HTTP status of the last fetch (0: none, a network error).
    status: int = 0
    #: Why the last fetch failed, if it did (a stale copy may still be in use).
    error: str = ""

    def to_json(self) -> str:
        """The cache's JSON."""
        return json.dumps({"k": self.kind, "b": self.body, "t": self.fetched_ms,
                           "x": self.expires_ms, "s": self.status, "e": self.error},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Entry:
        """An entry from the cache's JSON (``ValueError`` if it is not one)."""
        data: dict[str, Any] = json.loads(raw)
        if data.get("k") not in KINDS:
            raise ValueError(f"not a robots.txt entry: kind {data.get('k')!r}")
        return cls(kind=str(data["k"]), body=str(data.get("b") or ""),
                   fetched_ms=int(data["t"]), expires_ms=int(data["x"]),
                   status=int(data.get("s") or 0), error=str(data.get("e") or ""))


@dataclass(frozen=True)
class Rules:
    """What an origin's robots.txt says to ``agent``."""

    kind: str
    agent: str
    parser: _Parser | None
    #: Least seconds between two requests: ``Crawl-delay``, or ``Request-rate``
    #: as seconds per request, whichever is longer; ``None``: neither.
    crawl_delay_s: float | None

    def allowed(self, url: str) -> bool:
        """Whether ``url`` (of this origin) may be fetched."""
        if self.kind == "allow":
            return True
        if self.kind == "deny" or self.parser is None:
            return False
        return bool(self.parser.can_fetch(url, self.agent))


def parse(kind: str, body: str, agent: str) -> Rules:
    """The rules of a cache entry for user agent ``agent``. Malformed lines are
    skipped, as both parsers do: a body with no valid rule allows everything."""
    if kind != "rules":
        return Rules(kind, agent, None, None)
    return _parse_body(body, agent)


# Every task of an origin reads the same entry: parsed once per process and
# fetch, not once per task.
@lru_cache(maxsize=1024)
def _parse_body(body: str, agent: str) -> Rules:
    try:
        from protego import Protego
    except ImportError:  # the robots extra is not installed
        return _parse_stdlib(body, agent)
    parser = Protego.parse(body)
    delay = parser.crawl_delay(agent)
    rate = parser.request_rate(agent)
    per_request = rate.seconds / rate.requests if rate is not None and rate.requests else None
    return Rules("rules", agent, parser, _longest(delay, per_request))


class _Stdlib:
    """``urllib.robotparser`` behind protego's ``can_fetch(url, agent)``."""

    def __init__(self, body: str) -> None:
        from urllib.robotparser import RobotFileParser

        self.parser = RobotFileParser()
        self.parser.parse(body.splitlines())
        # can_fetch answers False until it believes the file was read.
        self.parser.modified()

    def can_fetch(self, url: str, user_agent: str) -> bool:
        return self.parser.can_fetch(user_agent, url)  # its order is (agent, url)


def _parse_stdlib(body: str, agent: str) -> Rules:
    parser = _Stdlib(body)
    delay = parser.parser.crawl_delay(agent)
    rate = parser.parser.request_rate(agent)
    per_request = rate.seconds / rate.requests if rate is not None and rate.requests else None
    return Rules("rules", agent, parser, _longest(
        float(delay) if delay is not None else None, per_request))


def _longest(*values: float | None) -> float | None:
    given = [v for v in values if v is not None and v >= 0]
    return max(given) if given else None
