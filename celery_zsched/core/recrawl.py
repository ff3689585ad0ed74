"""Change-aware recrawl: estimate how often a page changes, choose when to fetch it again.

Cho and Garcia-Molina model a page's changes as a Poisson process of rate λ
("Estimating frequency of change", TOIT 2003; "Effective page refresh
policies for Web crawlers", TODS 2003). A crawler only sees, at each visit,
whether the page changed since the last one. For ``n`` visits ``I`` apart of
which ``X`` saw a change, their estimator for such incomplete histories is

    λ = -ln((n - X + 0.5) / (n + 0.5)) / I

(the 0.5s keep it finite when every visit saw a change, and nearly unbiased).
Our intervals are irregular (they adapt, and pacing delays fires), so ``I`` is
the mean interval ``T / n`` over the time ``T`` the history covers. And the
history is exponentially decayed: each visit multiplies ``n``, ``X`` and ``T``
by :data:`DECAY` before adding itself, so the history is bounded (``n`` never
exceeds ``1 / (1 - DECAY)`` visits) and a page whose rate changes is followed
within a few dozen visits.

A visit only tells "changed" or "not", so a page that changed at every visit
may change far faster than visits can tell: the estimate saturates at
``ln(2n + 1) / I``, so at 20 visits a page changing a hundred times an interval
looks like one changing four times. When the page dates its last change (``Last-Modified``
within the visit's gap), the visit tells more: the page stayed unchanged from
that change to the visit. Summing, over the visits, the time each watched the
page unchanged (from the dated change if it saw one, else its whole gap) into
``W``, the likelihood of ``X`` changes is maximal at

    λ = X / W

(the case with the last-modification date known, treated in the same paper).
It does not saturate: a page that changes every second is seen to. It is used
while every change in the decayed history was dated (a site whose
``Last-Modified`` did not move when its content did, or that sends none, falls
back to the estimator above).

For rate λ and interval ``I``, the expected freshness (the share of time the
copy equals the page) is ``F = (1 - e^{-λI}) / (λI)`` and the expected age
``A = I/2 - 1/λ + (1 - e^{-λI}) / (λ² I)``. ``F`` depends on ``x = λI`` alone,
so a freshness target ``F*`` fixes ``x*`` (solved once by bisection) and the
interval is ``x* / λ``, clamped to the job's bounds. A page never seen to
change gets the upper bound; a job with no reports keeps its fixed interval.

``settle.lua`` does the same arithmetic on Redis' clock (compare-and-set with
the settle); this module is its Python mirror, and what readers (``zsched
show``, the REST API, the exporter, the capacity planner) call.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timezone
from email.utils import parsedate_to_datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_zsched.core.job import Job
    from celery_zsched.core.state import RuntimeState

#: Weight each visit keeps in the history per later visit: an effective
#: window of 1 / (1 - DECAY) = 20 visits.
DECAY = 0.95
#: While the decayed count of undated changes is below this (one undated change
#: decays under it in 14 visits), the dated estimate is used.
MAX_UNDATED = 0.5
#: Freshness target of adaptive jobs that set none (``zsched_freshness_target``).
DEFAULT_TARGET = 0.8
#: Default bounds of an adaptive job, as multiples of its ``interval_s``.
DEFAULT_LOW, DEFAULT_HIGH = 0.1, 10.0


@dataclass(frozen=True)
class History:
    """A job's decayed visit history (what ``settle.lua`` keeps in its runtime state)."""

    visits: float = 0.0
    changes: float = 0.0
    #: Seconds the visits covered (each the time since the visit before it).
    covered_s: float = 0.0
    #: Redis time (ms) of the last visit, and of the last change seen.
    last_visit_ms: int | None = None
    last_change_ms: int | None = None
    #: Seconds the visits watched the page unchanged, and the changes they saw
    #: undated (``None``: a history from before dates were kept).
    watched_s: float | None = None
    undated: float | None = None

    def visit(self, now_ms: int, changed: bool, modified_ms: int | None = None) -> History:
        """The history after a visit at ``now_ms`` that saw (or did not see) a change,
        the page dating its last change at ``modified_ms`` (its ``Last-Modified``).

        The first visit only sets the baseline: with nothing before it, it
        covers no time and cannot tell a change.
        """
        last_change = now_ms if changed and self.last_visit_ms is not None else self.last_change_ms
        if self.last_visit_ms is None:
            return replace(self, last_visit_ms=now_ms, last_change_ms=last_change)
        gap = max(0.0, (now_ms - self.last_visit_ms) / 1000)
        watched, undated = gap, 0
        if changed:
            # A date outside the gap says nothing of this change: a Last-Modified
            # that did not move with the content, or a clock ahead of Redis'.
            if modified_ms is not None and self.last_visit_ms < modified_ms <= now_ms:
                watched = (now_ms - modified_ms) / 1000
            else:
                undated = 1
        # A history from before dates were kept counts its changes undated until
        # they decay away.
        was_watched = self.covered_s if self.watched_s is None else self.watched_s
        was_undated = self.changes if self.undated is None else self.undated
        return History(self.visits * DECAY + 1, self.changes * DECAY + (1 if changed else 0),
                       self.covered_s * DECAY + gap, now_ms, last_change,
                       was_watched * DECAY + watched, was_undated * DECAY + undated)

    def rate(self) -> float | None:
        """Estimated changes per second, or ``None`` without a visit to go on."""
        if self.dated:
            return dated_rate(self.visits, self.changes, self.watched_s or 0.0)
        return change_rate(self.visits, self.changes, self.covered_s)

    @property
    def dated(self) -> bool:
        """Whether :meth:`rate` is the dated estimate (every change seen was dated)."""
        return (self.watched_s is not None and self.watched_s > 0 and self.visits > 0
                and (self.undated or 0.0) < MAX_UNDATED)

    @property
    def estimator(self) -> str | None:
        """Which estimate :meth:`rate` gives: ``dated``, ``change-or-not`` or ``None``."""
        if self.rate() is None:
            return None
        return "dated" if self.dated else "change-or-not"


def dated_rate(visits: float, changes: float, watched_s: float) -> float | None:
    """The maximum-likelihood rate when every change seen was dated: ``X / W``."""
    if visits <= 0 or watched_s <= 0:
        return None
    return min(max(changes, 0.0), visits) / watched_s


def change_rate(visits: float, changes: float, covered_s: float) -> float | None:
    """Cho and Garcia-Molina's estimate (per second) at the history's mean interval."""
    if visits <= 0 or covered_s <= 0:
        return None
    changes = min(max(changes, 0.0), visits)
    mean_interval = covered_s / visits
    return -math.log((visits - changes + 0.5) / (visits + 0.5)) / mean_interval


def freshness(rate: float, interval_s: float) -> float:
    """Expected freshness of a page of change ``rate`` fetched every ``interval_s``."""
    x = rate * interval_s
    return 1.0 if x <= 1e-12 else -math.expm1(-x) / x


def age_s(rate: float, interval_s: float) -> float:
    """Expected age (seconds the copy has been stale), Cho's definition."""
    x = rate * interval_s
    if x <= 1e-9 or interval_s <= 0:
        return 0.0
    return max(0.0, interval_s / 2 - 1 / rate + (-math.expm1(-x)) / (rate * x))


@lru_cache(maxsize=64)
def target_ratio(target: float) -> float:
    """The ``x = λI`` at which expected freshness equals ``target`` (0 < target < 1)."""
    if not 0 < target < 1:
        raise ValueError(f"a freshness target is between 0 and 1, got {target!r}")
    # F(x) < 1/x, so F(x) = target below x = 1/target; F decreases in x.
    low, high = 0.0, 1 / target
    for _ in range(100):
        mid = (low + high) / 2
        if freshness(1.0, mid) > target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def choose_interval_s(rate: float | None, target: float, low_s: float, high_s: float,
                      fixed_s: float) -> float:
    """The next interval: ``fixed_s`` without an estimate, else ``x*/rate`` in [low, high]."""
    if rate is None:
        return fixed_s
    if rate <= 0:
        return high_s
    return min(max(target_ratio(target) / rate, low_s), high_s)


def bounds_s(job: Job) -> tuple[float, float]:
    """An adaptive job's [min, max] interval: its own, else a tenth and ten times ``interval_s``."""
    base = job.interval_s or 0.0
    low = job.min_interval_s if job.min_interval_s is not None else base * DEFAULT_LOW
    high = job.max_interval_s if job.max_interval_s is not None else base * DEFAULT_HIGH
    return low, max(low, high)


def history_of(state: RuntimeState) -> History:
    """The visit history in a job's runtime state."""
    return History(state.visits or 0.0, state.changes or 0.0, state.covered_s or 0.0,
                   state.last_visit_ms, state.last_change_ms, state.watched_s, state.undated)


def current_interval_s(job: Job, state: RuntimeState | None = None) -> float | None:
    """The interval a job runs at now: ``interval_s``, or an adaptive job's chosen one.

    ``None`` for cron and one-off jobs. Pure: the capacity planner reads it.
    """
    if job.kind != "interval" or job.interval_s is None:
        return None
    if job.recrawl != "adaptive" or state is None or state.recrawl_interval_ms is None:
        return job.interval_s
    return state.recrawl_interval_ms / 1000


#: Longest validator the store keeps (an ETag, a Last-Modified HTTP-date, a
#: signature): bounded so a hostile site cannot grow the runtime state.
MAX_VALIDATOR = {"etag": 512, "last_modified": 64, "signature": 128}


@dataclass(frozen=True)
class Visit:
    """What a run saw of its page: whether it changed, and the validators to keep.

    ``changed`` is the task's word; without it a ``signature`` (a hash of the
    content, or an ETag) unlike the stored one is a change. ``etag`` and
    ``last_modified`` are kept for the next conditional request.
    """

    changed: bool | None = None
    signature: str | None = None
    etag: str | None = None
    last_modified: str | None = None

    def __post_init__(self) -> None:
        if self.changed is not None and not isinstance(self.changed, bool):
            raise ValueError(f"changed must be True, False or None, got {self.changed!r:.40}")
        for name, limit in MAX_VALIDATOR.items():
            problem = validator_problem(getattr(self, name), limit)
            if problem:
                raise ValueError(f"{name} {problem}")

    def settle_args(self, policy: dict[str, float] | None) -> dict[str, str]:
        """``settle.lua``'s ARGV for this visit and an adaptive job's ``policy``."""
        return {"changed": "" if self.changed is None else "1" if self.changed else "0",
                "content_signature": self.signature or "", "etag": self.etag or "",
                "last_modified": self.last_modified or "",
                "recrawl": json.dumps(policy) if policy else "",
                "modified_ms": "" if (at := self.modified_ms) is None else str(at)}

    @property
    def modified_ms(self) -> int | None:
        """``last_modified`` as epoch ms, or ``None`` when it is not an HTTP-date."""
        return http_date_ms(self.last_modified)

    @property
    def reported(self) -> bool:
        """Whether it says anything at all."""
        return any(v is not None for v in (self.changed, self.signature, self.etag,
                                           self.last_modified))


def http_date_ms(value: str | None) -> int | None:
    """An HTTP-date (``Last-Modified``) as epoch ms; ``None`` when it is none."""
    if not value:
        return None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # HTTP-dates are GMT, whether or not they say so
        when = when.replace(tzinfo=timezone.utc)
    return round(when.timestamp() * 1000)


def validator_problem(value: object, limit: int) -> str | None:
    """Why ``value`` cannot be kept as a validator (and sent back in a request header)."""
    if value is None:
        return None
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value or len(value) > limit:
        return f"must be 1-{limit} characters, got {len(value):,}"
    # Printable ASCII only: the value goes back out in an HTTP header, where a CR
    # or LF would let a site inject headers of its own.
    if not (value.isascii() and value.isprintable()):
        return "must be printable ASCII (it goes back in an HTTP header)"
    return None


def recrawl_policy(job: Job, target: float, jitter_ms: int,
                   allocation: bool = False) -> dict[str, float] | None:
    """What ``settle.lua`` needs to choose an adaptive job's next interval (None: fixed).
    ``allocation``: by Cho's allocation when its domain has a multiplier."""
    if job.recrawl != "adaptive" or job.kind != "interval" or job.interval_s is None:
        return None
    low, high = bounds_s(job)
    policy = {"lo": round(low * 1000), "hi": round(high * 1000),
              "x": target_ratio(job.freshness_target or target),
              "f": round(job.interval_s * 1000), "j": jitter_ms}
    if allocation:
        policy["a"] = 1
    return policy


def summary(job: Job, state: RuntimeState, now_ms: int) -> dict[str, Any]:
    """What change-aware recrawl knows of a job, for people (``zsched show``, the REST
    API, the admin): its mode, current interval, estimated change rate (per day),
    expected freshness and age at that interval, and the time since a change was seen."""
    history = history_of(state)
    rate = history.rate()
    interval = current_interval_s(job, state)
    since = None if state.last_change_ms is None else max(0, now_ms - state.last_change_ms) / 1000
    return {
        "recrawl": job.recrawl, "interval_s": interval,
        "visits": round(state.visits or 0.0, 3),
        "change_rate_per_day": None if rate is None else rate * 86_400,
        "estimator": history.estimator,
        "expected_freshness": None if rate is None or interval is None
        else freshness(rate, interval),
        "expected_age_s": None if rate is None or interval is None else age_s(rate, interval),
        "since_last_change_s": since,
    }


@dataclass(frozen=True)
class JobEstimate:
    """One sampled job's estimate: change rate (per s), interval (s), freshness, age (s)."""

    rate: float
    interval_s: float
    freshness: float
    age_s: float


def estimate(state: RuntimeState) -> JobEstimate | None:
    """The job's expected freshness and age now, or ``None`` without reports."""
    history = history_of(state)
    rate = history.rate()
    if rate is None or not history.visits:
        return None
    interval = (state.recrawl_interval_ms / 1000 if state.recrawl_interval_ms
                else history.covered_s / history.visits)
    return JobEstimate(rate, interval, freshness(rate, interval), age_s(rate, interval))


# Cho and Garcia-Molina's allocation ("Effective page refresh policies", TODS
# 2003): the fetch frequencies f_i that maximise the total freshness for a
# budget sum(f_i) = B make every page's marginal freshness per fetch equal,
# 1 - (1 + x) e^{-x} = mu * lambda with x = lambda / f; a page with
# mu * lambda >= 1 changes too fast to be worth any fetch (its upper bound).
# The capacity planner, which knows each domain's budget, solves mu
# (solve_mu_pages) and stores it; settle.lua reads it and mirrors
# allocation_interval_s (zsched_recrawl_allocation).
def allocation_interval_s(rate: float, mu: float, low_s: float, high_s: float) -> float:
    """The interval Cho's allocation gives a page of change ``rate`` at multiplier ``mu``."""
    if rate <= 0 or mu * rate >= 1:
        return high_s
    goal = mu * rate
    low, high = 0.0, 60.0
    for _ in range(60):
        mid = (low + high) / 2
        if -math.expm1(-mid) - mid * math.exp(-mid) < goal:
            low = mid
        else:
            high = mid
    return min(max((low + high) / 2 / rate, low_s), high_s)


def solve_mu(rates: list[float], budget_per_s: float, low_s: float, high_s: float) -> float:
    """The multiplier at which the allocation spends ``budget_per_s`` fetches a second
    over pages of ``rates`` (each interval in [low_s, high_s])."""
    return solve_mu_pages({(r, low_s, high_s): 1 for r in rates}, budget_per_s)


def solve_mu_pages(pages: Mapping[tuple[float, float, float], int],
                   budget_per_s: float) -> float:
    """:func:`solve_mu` over pages of their own bounds: ``(rate, low_s, high_s) -> how many``.
    A budget below the pages' least spend gives the largest multiplier (every page
    at its upper bound); above their most, the smallest (every page at its lower)."""
    def spent(mu: float) -> float:
        return sum(n / allocation_interval_s(r, mu, lo, hi) for (r, lo, hi), n in pages.items())

    low, high = 1e-9, 1e9
    for _ in range(80):
        mid = math.sqrt(low * high)
        if spent(mid) > budget_per_s:
            low = mid
        else:
            high = mid
    return math.sqrt(low * high)
