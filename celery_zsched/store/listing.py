"""Listing jobs a page at a time, filtered, behind ``GET /v1/jobs``.

A listing walks every partition in order, and within one partition the
definitions hash with HSCAN: constant memory and bounded work per page,
whatever the number of jobs. With ``status=paused`` or ``status=dead`` it walks
the (much smaller) paused set (SSCAN) or dead-letter set (ZSCAN) instead; the
scripts keep every job of those statuses in that set.

Filters apply to the definition (``kind``, ``queue``, ``domain``,
``transport``) and to the live state (``status``, the :class:`JobInfo` status
as :meth:`Store.get_many` builds it). Live state is fetched in one pipeline,
only for the rows whose definition passed.

What a walk promises, following each page's ``next_cursor`` until it is ``None``:

- A job that exists for the whole walk is returned at least once.
- Within one page a job appears at most once. Across pages a job shows up
  twice only when the hash changed shape under the walk: Redis was rehashing
  it (SCAN's own rule; Redis rehashes a hash that grew one bucket per lookup,
  so a hash written to just before the walk may still be rehashing during
  it), or writes changed how far the batch a page stopped inside reaches.
- Every page has at most ``limit`` items, and may have fewer, even none,
  while ``next_cursor`` is set: each call examines at most ``budget`` rows
  (each scan call counts as at least one), and filters drop rows.
- A walk ends. Every call moves the position forward, except that a batch
  which reads back reaching further than before (rows deleted in it) is read
  again whole; the scan of a partition then ends as SCAN's does, unless
  writes grow the store, or delete inside that batch, without end.

Cost: a walk reads every definition once (plus a re-read of the batch a page
stopped inside), and the live state of the rows whose definition passed, so a
filtered walk costs as much as an unfiltered one in Redis. With ``status=paused``
or ``status=dead`` it reads only those sets and those jobs.

The cursor is opaque to clients: URL-safe base64 of the position (partition,
the scan cursor where the current batch started, where it ended, its COUNT, the
last id examined from it), bound to the filter and the partition count, with a
checksum. A scan may return a batch larger than asked (small hashes and sets
come back whole), so a page can stop inside a batch: the next call reads that
batch again and skips the ids up to the last one examined, which is exact as
long as the batch reads back reaching no further than the first time. A malformed, tampered or
foreign cursor raises :class:`ValidationError` naming ``cursor``.

The ``domain`` filter matches the job's domain key: its explicit ``domain``,
else its URL's host (the registrable domain with ``zsched_domain_registrable``),
normalised; with pacing on this is the domain it is paced under.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from celery_zsched.core.domains import domain_of, normalise_domain
from celery_zsched.core.errors import ValidationError
from celery_zsched.core.job import TRANSPORTS, Job
from celery_zsched.core.results import JobInfo
from celery_zsched.core.state import RuntimeState
from celery_zsched.store import Store
from celery_zsched.store.errors import redis_unavailable
from celery_zsched.store.keys import Keys

__all__ = ["KINDS", "MAX_LIMIT", "STATUSES", "JobFilter", "Page", "list_page"]

STATUSES = ("scheduled", "queued", "running", "paused", "dead", "finished")
KINDS = ("interval", "cron", "once")
MAX_LIMIT = 1000
#: Stores written before execution leases call a queued job "leased".
_STATUS_ALIASES = {"leased": "queued"}
#: Longest queue name a job may have (as :mod:`.job` validates it).
_MAX_QUEUE = 200
#: Bounds of a scan call's COUNT: a page's budget, within these.
_MIN_COUNT, _MAX_COUNT = 10, 1000
#: Scan sources: the definitions hash, the paused set, the dead-letter set.
_DEFS, _PAUSED, _DEAD = "d", "p", "x"
_CURSOR_VERSION = 1
# A checksum, not a secret: it tells a mangled cursor from a real one, so a
# bad one is refused instead of silently scanning from a made-up position.
_CURSOR_KEY = b"celery-zsched listing cursor"
_MAC_BYTES = 8


def _choice(name: str, value: str | None, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        raise ValidationError(name, value, f"must be one of {', '.join(allowed)}")


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a listing returns; every field left ``None`` matches all.

    ``queue=""`` means jobs with no queue of their own. ``domain`` is
    normalised (``Example.COM.`` is ``example.com``). A bad value raises
    :class:`ValidationError` naming the field.
    """

    status: str | None = None
    kind: str | None = None
    queue: str | None = None
    domain: str | None = None
    transport: str | None = None

    def __post_init__(self) -> None:
        _choice("status", self.status, STATUSES)
        _choice("kind", self.kind, KINDS)
        _choice("transport", self.transport, TRANSPORTS)
        if self.queue is not None and (not isinstance(self.queue, str)
                                       or len(self.queue) > _MAX_QUEUE):
            raise ValidationError("queue", self.queue,
                                  f"must be a string of at most {_MAX_QUEUE} characters")
        if self.domain is not None:
            try:
                if not isinstance(self.domain, str):
                    raise ValueError("must be a string")
                # Frozen: normalised once here, so matching compares plain strings.
                object.__setattr__(self, "domain", normalise_domain(self.domain))
            except ValueError as exc:
                raise ValidationError("domain", self.domain, str(exc)) from None

    @property
    def on_definition(self) -> bool:
        """Whether any field is read from the definition."""
        return any(v is not None for v in (self.kind, self.queue, self.domain, self.transport))

    def keeps_job(self, job: Job, registrable: bool) -> bool:
        """Whether ``job``'s definition passes (``registrable``: domains are grouped)."""
        if not self.on_definition:
            return True
        return ((self.kind is None or job.kind == self.kind)
                and (self.queue is None or (job.queue or "") == self.queue)
                and (self.transport is None or job.transport == self.transport)
                and (self.domain is None or _domain_is(job, self.domain, registrable)))

    def keeps_status(self, status: str) -> bool:
        """Whether a job of this live status passes."""
        return self.status is None or _STATUS_ALIASES.get(status, status) == self.status

    def keeps(self, info: JobInfo, registrable: bool) -> bool:
        """Whether a job with its live state passes."""
        return self.keeps_status(info.status) and self.keeps_job(info.job, registrable)

    @property
    def source(self) -> str:
        """The set a walk scans: paused and dead jobs have sets of their own."""
        return {"paused": _PAUSED, "dead": _DEAD}.get(self.status or "", _DEFS)

    def digest(self) -> str:
        """Short fingerprint binding a cursor to this filter."""
        text = json.dumps([self.status, self.kind, self.queue, self.domain, self.transport])
        return hashlib.sha1(text.encode()).hexdigest()[:8]



def _domain_is(job: Job, domain: str, registrable: bool) -> bool:
    """Whether ``job``'s domain key is ``domain`` (already normalised)."""
    if job.domain:  # normalised when the job was validated
        return job.domain == domain
    host = urlsplit(job.url).hostname if job.url else None
    # The key is the host or, grouped, a suffix of it; and an ASCII name (not an
    # IPv6 address) normalises to itself. So most hosts are ruled out here,
    # before the IDNA and public-suffix lookups, whose cache a walk over more
    # distinct hosts than it holds would miss on every row.
    if host and host.isascii() and ":" not in host and \
            not host.rstrip(".").endswith(domain):
        return False
    return domain == domain_of(job.url, None, group_registrable=registrable)

@dataclass(frozen=True)
class Page:
    """One page of a listing; ``next_cursor`` is ``None`` when the walk is over."""

    items: list[JobInfo]
    next_cursor: str | None


@dataclass(frozen=True)
class _Position:
    """Where a walk stands: partition ``part``, in the batch a scan from ``start`` returns.

    ``last`` is the last id examined from that batch (``None``: none yet),
    ``end`` the scan cursor that batch returned and ``count`` its COUNT.
    """

    part: int = 0
    start: int = 0
    end: int = 0
    count: int = 0
    last: str | None = None


def _encode(pos: _Position, partitions: int, flt: JobFilter) -> str:
    payload = json.dumps([_CURSOR_VERSION, flt.digest(), partitions, pos.part, pos.start,
                          pos.end, pos.count, pos.last], separators=(",", ":")).encode()
    mac = hashlib.blake2b(payload, key=_CURSOR_KEY, digest_size=_MAC_BYTES).digest()
    return base64.urlsafe_b64encode(mac + payload).decode().rstrip("=")


def _decode(text: Any, partitions: int, flt: JobFilter) -> _Position:
    def bad(message: str) -> ValidationError:
        return ValidationError("cursor", text, message)

    if not isinstance(text, str) or not 0 < len(text) <= 2048:
        raise bad("is not a cursor this listing returned")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise bad("is not a cursor this listing returned") from None
    mac, payload = raw[:_MAC_BYTES], raw[_MAC_BYTES:]
    expected = hashlib.blake2b(payload, key=_CURSOR_KEY, digest_size=_MAC_BYTES).digest()
    if len(mac) != _MAC_BYTES or mac != expected:
        raise bad("is damaged or was not made by this listing")
    try:
        version, digest, parts, part, start, end, count, last = json.loads(payload)
    except (ValueError, TypeError):  # checksummed, so only a cursor of another version
        raise bad("is not a cursor this version made: start without a cursor") from None
    if version != _CURSOR_VERSION or digest != flt.digest():
        raise bad("belongs to another listing (other filters): start without a cursor")
    if parts != partitions:
        raise bad("was made before the store was repartitioned: start without a cursor")
    ints = (part, start, end, count)
    if (not all(type(v) is int and v >= 0 for v in ints) or part >= partitions
            or max(start, end) >= 2 ** 64 or count > _MAX_COUNT
            or not (last is None or isinstance(last, str))):
        raise bad("points outside the store")
    return _Position(part, start, end, count, last)


def _scan_order(cursor: int) -> int:
    """Progress of a scan cursor: SCAN counts up in the bit-reversed cursor, and
    so stays ordered across table resizes; 0, the scan's end, is last."""
    return int(f"{cursor:064b}"[::-1], 2) if cursor else 2 ** 64


def _count(flt: JobFilter, walk: _Walk) -> int:
    """COUNT of a new scan call: what a page likely needs. A page that stops
    inside a batch reads it again next time, so reading far more costs."""
    want = walk.limit if flt == JobFilter() else 10 * walk.limit
    return min(max(want, _MIN_COUNT), walk.left, _MAX_COUNT)


def _scan(store: Store, source: str, keys: Keys, start: int, count: int
          ) -> tuple[int, list[tuple[str, str | None]]]:
    """One scan call: its next cursor and its rows (id, definition or None) sorted by id."""
    client = store.client
    rows: dict[str, str | None]
    if source == _DEFS:
        end, found = client.hscan(keys.defs, start, count=count)
        rows = {str(k): v for k, v in found.items()}
    elif source == _PAUSED:
        end, members = client.sscan(keys.paused, start, count=count)
        rows = dict.fromkeys(map(str, members))
    else:
        end, pairs = client.zscan(keys.dead, start, count=count)
        rows = {str(member): None for member, _score in pairs}
    return int(end), sorted(rows.items())


@dataclass
class _Walk:
    """The work of one page: rows examined so far, items found, ids already on it."""

    store: Store
    flt: JobFilter
    limit: int
    left: int
    items: list[JobInfo] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)

    @property
    def done(self) -> bool:
        return self.left <= 0 or len(self.items) >= self.limit

    def take(self, rows: list[tuple[str, str | None]]) -> int:
        """Examine ``rows`` in order until the page is done; how many were examined."""
        registrable = self.store.settings.domain_registrable
        stop = min(len(rows), self.left)
        picked = [(index, job_id) for index, (job_id, raw) in enumerate(rows[:stop])
                  if raw is None or self.flt.keeps_job(Job.from_json(raw), registrable)]
        if self.flt.status is not None and picked:
            # The status is in the small state value: whole jobs are fetched
            # only for the rows it keeps (a selective status walk reads ~no definitions).
            states = self.store.states([job_id for _, job_id in picked])
            picked = [row for row, state in zip(picked, states, strict=True)
                      if self.flt.keeps_status((state or RuntimeState()).status)]
        at = 0
        while at < len(picked) and len(self.items) < self.limit:
            chunk = picked[at:at + self.limit - len(self.items)]
            at += len(chunk)
            infos = self.store.get_many([job_id for _, job_id in chunk])
            for (index, job_id), info in zip(chunk, infos, strict=True):
                # None: deleted since the scan; it did not exist for the whole walk.
                if info is None or job_id in self.seen or not self.flt.keeps(info, registrable):
                    continue
                self.items.append(info)
                self.seen.add(job_id)
                if len(self.items) == self.limit:
                    stop = index + 1
                    break
        self.left -= max(stop, 1)
        return stop


def list_page(store: Store, flt: JobFilter, *, limit: int = 50, cursor: str | None = None,
              budget: int | None = None) -> Page:
    """One page of the jobs ``flt`` keeps, from ``cursor`` (``None``: the start).

    ``limit`` (1..1000) caps the items; ``budget`` (default ``max(1000,
    10 * limit)``) caps the rows examined. See the module docstring for what a
    walk promises. Raises :class:`ValidationError` naming ``limit``, ``budget``
    or ``cursor``, and :class:`StoreUnavailable` when Redis is down.
    """
    if type(limit) is not int or not 1 <= limit <= MAX_LIMIT:
        raise ValidationError("limit", limit, f"must be an integer from 1 to {MAX_LIMIT}")
    if budget is None:
        budget = max(1000, 10 * limit)
    elif type(budget) is not int or budget < 1:
        raise ValidationError("budget", budget, "must be a positive integer")
    pos = _Position() if cursor is None else _decode(cursor, store.partitions, flt)
    # Like every Store read: StoreUnavailable when Redis is down, and the
    # partition layout checked first (the walk relies on the partition count).
    with redis_unavailable():
        if not store.layout_checked:
            store.check_layout()
        return _walk(store, flt, _Walk(store, flt, limit, budget), pos)


def _walk(store: Store, flt: JobFilter, walk: _Walk, pos: _Position) -> Page:
    part, start, last = pos.part, pos.start, pos.last
    while not walk.done:
        count = pos.count if last is not None else _count(flt, walk)
        end, rows = _scan(store, flt.source, store.parts[part], start, count)
        # Reading no further than before, the batch holds no row the first read
        # lacked, so ids up to `last` were examined. Further (rows deleted in
        # between), it may: read it all again.
        if last is not None and _scan_order(end) <= _scan_order(pos.end):
            rows = [row for row in rows if row[0] > last]
        examined = walk.take(rows)
        if examined < len(rows):
            inside = _Position(part, start, end, count, rows[examined - 1][0])
            return Page(walk.items, _encode(inside, store.partitions, flt))
        last = None
        part, start = (part + 1, 0) if end == 0 else (part, end)
        if part == store.partitions:
            return Page(walk.items, None)
    return Page(walk.items, _encode(_Position(part, start), store.partitions, flt))
