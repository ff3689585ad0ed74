"""Domains: which site a job's request goes to, and what Redis knows about that site.

A job's domain is the key its politeness is counted under: its explicit
``domain``, else the host of its URL. Hosts are lower-cased and IDNA-encoded
(UTS #46, as browsers do), so ``Bücher.example`` and ``xn--bcher-kva.example``
share one gate. With ``zsched_domain_registrable`` hosts are grouped by their
registrable domain (eTLD+1) from the bundled Public Suffix List, so
``a.example.co.uk`` and ``b.example.co.uk`` share one gate too. IP addresses
are their own domain: they have no registrable part.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import idna
from publicsuffixlist import PublicSuffixList

from celery_zsched.core.errors import show_value

#: Longest domain name DNS allows (RFC 1035).
_MAX_NAME = 253


@lru_cache(maxsize=1)
def _suffixes() -> PublicSuffixList:
    # Loads the list bundled with the package: no network, ~50 ms once per process.
    return PublicSuffixList()


# Hosts repeat across a fleet (thousands of jobs per site), and IDNA encoding
# costs ~40 us: cached, an import pays it once per host.
@lru_cache(maxsize=65536)
def normalise_domain(text: str) -> str:
    """``text`` (a host name, IP address or explicit domain key) in canonical form.

    Raises ``ValueError`` naming what is wrong: empty, too long, or not a
    valid IDNA host name.
    """
    host = text.strip().rstrip(".").lower()
    if not host:
        raise ValueError("domain is empty")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        encoded = idna.encode(host, uts46=True).decode("ascii")
    except idna.IDNAError as exc:
        raise ValueError(f"domain {show_value(text)} is not a valid host name: {exc}") from None
    if len(encoded) > _MAX_NAME:
        raise ValueError(f"domain {show_value(text)} is longer than {_MAX_NAME} characters")
    return encoded


@lru_cache(maxsize=65536)
def registrable(host: str) -> str:
    """The registrable domain (eTLD+1) of a normalised ``host``; the host itself when
    it has none (an IP address, ``localhost``, or a bare public suffix)."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    return _suffixes().privatesuffix(host) or host


def domain_sort_key(name: str) -> tuple[int, int, str]:
    """Order for listings: IP addresses by number (127.0.0.2 before 127.0.0.10), then names."""
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return (1, 0, name)
    return (0, int(address) + (address.version << 128), "")


def domain_of(url: str | None, explicit: str | None = None, *,
              group_registrable: bool = False) -> str | None:
    """The domain a job is paced under, or ``None`` (no URL and no explicit domain).

    An explicit domain is taken as given (normalised, never grouped): it is the
    user's own choice of key.
    """
    if explicit:
        return normalise_domain(explicit)
    if not url:
        return None
    host = urlsplit(url).hostname
    if not host:
        return None
    name = normalise_domain(host)
    return registrable(name) if group_registrable else name


@dataclass(frozen=True)
class DomainInfo:
    """One domain's pacing, as the store reads it (times on the Redis clock, in ms)."""

    name: str
    #: Delay between two request starts in force now (the adaptive delay, never
    #: below the base).
    delay_s: float
    #: Configured delay: the domain's override, else ``zsched_domain_delay_s``.
    base_delay_s: float
    in_flight: int
    #: Most in flight; 0 is unlimited.
    max_in_flight: int
    adaptive: bool
    #: ``closed``, ``open`` or ``half-open``.
    breaker: str
    breaker_until_ms: int | None
    #: The gate a Retry-After closed, until this time.
    closed_until_ms: int | None
    last_429_ms: int | None
    completed: int
    failed: int
    throttled_429: int
    #: Times the claim held one of its jobs back.
    held: int
    overridden: bool
    now_ms: int
    #: Where the configured delay comes from: ``override`` (the operator's),
    #: ``robots`` (the site's Crawl-delay, above the setting), ``config`` (the
    #: ``zsched_domain_delay_s`` setting) or ``default`` (its built-in value).
    delay_source: str = "default"
    #: The Crawl-delay of the domain's robots.txt, when one was read (and
    #: ``zsched_robots`` is on).
    robots_delay_s: float | None = None

    @property
    def throttled(self) -> bool:
        """Slower than configured now: a raised adaptive delay or a closed gate."""
        return self.delay_s > self.base_delay_s or (
            self.closed_until_ms is not None and self.closed_until_ms > self.now_ms)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict, with ``throttled``."""
        return {**asdict(self), "throttled": self.throttled}


def info_from(name: str, raw_state: str | bytes | None, raw_conf: str | bytes | None,
              defaults: PacingDefaults, now_ms: int) -> DomainInfo:
    """Build a :class:`DomainInfo` from the two hash values Lua keeps (see ``_prelude.lua``)."""
    st: dict[str, Any] = json.loads(raw_state) if raw_state else {}
    conf: dict[str, Any] = json.loads(raw_conf) if raw_conf else {}
    robots_ms = float(st["rd"]) if defaults.robots and st.get("rd") else None
    base_ms, source = _base_delay(conf, defaults, robots_ms)
    adaptive = bool(conf.get("adaptive", True))
    current = max(base_ms, float(st.get("d") or 0)) if adaptive else base_ms
    breaker = {"open": "open", "half": "half-open"}.get(str(st.get("b") or ""), "closed")
    if breaker == "open" and int(st.get("bo") or 0) <= now_ms:
        breaker = "half-open"  # the cool-down is over: the next due job is the probe

    def opt(key: str) -> int | None:
        value = st.get(key)
        return int(value) if value else None

    closed = opt("cu")
    return DomainInfo(
        name=name, delay_s=current / 1000, base_delay_s=base_ms / 1000,
        in_flight=int(st.get("n") or 0), max_in_flight=int(conf.get("cap", defaults.cap)),
        adaptive=adaptive, breaker=breaker,
        breaker_until_ms=opt("bo") if breaker == "open" else None,
        closed_until_ms=closed if closed and closed > now_ms else None,
        last_429_ms=opt("t4"), completed=int(st.get("tc") or 0), failed=int(st.get("tf") or 0),
        throttled_429=int(st.get("t4n") or 0), held=int(st.get("h") or 0),
        overridden=bool(conf), now_ms=now_ms, delay_source=source,
        robots_delay_s=robots_ms / 1000 if robots_ms is not None else None)


def _base_delay(conf: dict[str, Any], defaults: PacingDefaults,
                robots_ms: float | None) -> tuple[float, str]:
    # As domain_base in _prelude.lua: the override wins, then Crawl-delay as a floor.
    if "delay" in conf:
        return float(conf["delay"]), "override"
    if robots_ms is not None and robots_ms > defaults.delay_ms:
        return robots_ms, "robots"
    return float(defaults.delay_ms), "config" if defaults.delay_configured else "default"


@dataclass(frozen=True)
class PacingDefaults:
    """The pacing settings, in the units the Lua scripts use (ms)."""

    delay_ms: int
    cap: int
    max_delay_ms: int
    backoff: float
    decrease_ms: int
    breaker_ratio: float
    breaker_window_ms: int
    breaker_min: int
    breaker_cooldown_ms: int
    start_margin_ms: int = 0
    #: A robots.txt Crawl-delay is a floor under the delay (``zsched_robots``).
    robots: bool = False
    #: ``zsched_domain_delay_s`` was set to other than its built-in default.
    delay_configured: bool = False

    def to_json(self) -> str:
        """The ARGV value every pacing-aware script reads (``pacing_config`` in the prelude)."""
        return json.dumps({
            "delay": self.delay_ms, "cap": self.cap, "max": self.max_delay_ms,
            "factor": self.backoff, "dec": self.decrease_ms, "ratio": self.breaker_ratio,
            "window": self.breaker_window_ms, "min": self.breaker_min,
            "cool": self.breaker_cooldown_ms, "margin": self.start_margin_ms,
            "robots": self.robots},
            separators=(",", ":"))
