"""Change-aware recrawl (issue 22): the estimator and the interval choice, in pure Python
and in settle.lua on a real Redis (the two agree), compare-and-set with the settle."""

from __future__ import annotations

import json
import math
import random
import threading
import time

import pytest

from celery_zsched.core import recrawl
from celery_zsched.core.job import Job
from celery_zsched.core.recrawl import History, Visit, choose_interval_s, freshness
from celery_zsched.core.state import RuntimeState
from celery_zsched.store import Store

TARGET = 0.8
LOW, HIGH, FIXED = 60.0, 86_400.0, 600.0


def _interval(history: History) -> float:
    return choose_interval_s(history.rate(), TARGET, LOW, HIGH, FIXED)


def _visits(history: History, gaps_and_changes: list[tuple[float, bool]],
            start_ms: int = 10**12) -> History:
    now = history.last_visit_ms if history.last_visit_ms is not None else start_ms
    if history.last_visit_ms is None:
        history = history.visit(now, False)
    for gap, changed in gaps_and_changes:
        now += round(gap * 1000)
        history = history.visit(now, changed)
    return history


# ------------------------------------------------------------------ pure
def test_no_history_keeps_the_fixed_interval() -> None:
    assert History().rate() is None and _interval(History()) == FIXED
    # One visit only sets the baseline: still nothing to estimate from.
    assert _interval(History().visit(10**12, True)) == FIXED


def test_none_changed_goes_to_the_upper_bound() -> None:
    assert _interval(_visits(History(), [(600, False)] * 5)) == HIGH


def test_all_changed_gives_a_finite_rate_and_then_the_lower_bound() -> None:
    history = _visits(History(), [(600, True)] * 30)
    n = history.visits
    # Cho's estimator at a regular interval: -ln(0.5 / (n + 0.5)) / I. Finite: a
    # page that changed at every visit may change faster than visits can tell.
    assert history.rate() == pytest.approx(math.log((n + 0.5) / 0.5) / 600)
    assert LOW < _interval(history) < 600
    # Visiting at the intervals chosen, and still seeing a change each time,
    # walks the interval down to the lower bound.
    for _ in range(30):
        history = _visits(history, [(_interval(history), True)])
    assert _interval(history) == LOW


def test_the_interval_meets_the_target_within_the_bounds() -> None:
    history = _visits(History(), [(600, i % 4 == 0) for i in range(60)])
    rate = history.rate()
    assert rate is not None
    chosen = _interval(history)
    assert LOW < chosen < HIGH
    assert freshness(rate, chosen) == pytest.approx(TARGET)
    assert choose_interval_s(rate, TARGET, chosen * 2, HIGH, FIXED) == chosen * 2
    assert choose_interval_s(rate, TARGET, LOW, chosen / 2, FIXED) == chosen / 2


@pytest.mark.parametrize("target", [0.5, 0.8, 0.9, 0.99])
def test_target_ratio_solves_the_freshness_equation(target: float) -> None:
    assert freshness(1.0, recrawl.target_ratio(target)) == pytest.approx(target, abs=1e-9)


def test_the_estimate_recovers_a_known_poisson_rate() -> None:
    rng = random.Random(7)
    rate, interval = 1 / 900, 300.0
    changed = [rng.random() < -math.expm1(-rate * interval) for _ in range(4000)]
    n, x = len(changed), sum(changed)
    assert recrawl.change_rate(n, x, n * interval) == pytest.approx(rate, rel=0.1)


def test_a_rate_that_changes_mid_history_is_followed() -> None:
    slow = _visits(History(), [(3600, False)] * 40)
    assert _interval(slow) == HIGH
    # Three orders of magnitude in a little over a hundred visits: each visit at
    # the interval chosen, the decayed history forgets the slow past.
    fast = slow
    for _ in range(120):
        fast = _visits(fast, [(_interval(fast), True)])
    assert _interval(fast) == LOW
    calm = fast
    for _ in range(80):
        calm = _visits(calm, [(_interval(calm), False)])
    assert _interval(calm) == HIGH


def test_the_history_is_bounded() -> None:
    history = _visits(History(), [(60, True)] * 2000)
    assert history.visits < 1 / (1 - recrawl.DECAY) + 1e-6
    assert history.covered_s < 60 / (1 - recrawl.DECAY) + 1e-6


def _dated_visits(rate: float, interval: float, count: int, seed: int = 5) -> History:
    """``count`` visits ``interval`` apart to a Poisson page of ``rate``, each that saw a
    change dated by its last one (as a ``Last-Modified`` would, to the second)."""
    rng = random.Random(seed)
    now, next_change, last_change = 10**12, 10**12 + rng.expovariate(rate) * 1000, None
    history = History().visit(now, False)
    for _ in range(count):
        now += round(interval * 1000)
        changed = next_change <= now
        while next_change <= now:
            last_change = next_change
            next_change += rng.expovariate(rate) * 1000
        dated = None if not changed or last_change is None else int(last_change // 1000 * 1000)
        history = history.visit(now, changed, dated)
    return history


def test_a_dated_history_sees_a_fast_rate_that_change_or_not_cannot() -> None:
    # A page that changes 100 times an interval changed at every visit: from that
    # alone Cho's estimate saturates near ln(n + 0.5) / I, while the dates show
    # how long the page stayed unchanged before each visit.
    interval, rate = 60.0, 100 / 60.0
    history = _dated_visits(rate, interval, 200)
    assert history.changes == pytest.approx(history.visits)
    undated = recrawl.change_rate(history.visits, history.changes, history.covered_s)
    assert undated == pytest.approx(math.log(2 * history.visits + 1) / interval)
    # Dates to the second on changes 0.6 s apart read about 1.1 s a change: coarse,
    # but an order of magnitude past what change-or-not can tell.
    dated = history.rate()
    assert dated is not None and 10 * undated < dated <= rate
    # A slower page, its dates no coarser than its changes: within a few per cent.
    slow = _dated_visits(1 / 30, interval, 4000)
    assert slow.rate() == pytest.approx(1 / 30, rel=0.15)


def test_an_undated_change_falls_back_to_chos_estimate_until_it_decays() -> None:
    history = _dated_visits(1 / 30, 60.0, 100)
    assert history.rate() == recrawl.dated_rate(history.visits, history.changes,
                                                history.watched_s or 0.0)
    last = history.last_visit_ms or 0
    for undated in (None, last - 1000, last + 61_000 + 1):  # none, before the gap, ahead
        fallen = history.visit(last + 60_000, True, undated)
        assert fallen.undated == pytest.approx((history.undated or 0.0) * recrawl.DECAY + 1)
        assert fallen.rate() == recrawl.change_rate(fallen.visits, fallen.changes,
                                                    fallen.covered_s)
    # Fourteen visits on, the undated change weighs under MAX_UNDATED.
    later = history.visit(last + 60_000, True)
    for step in range(14):
        later = later.visit(last + 60_000 * (step + 2), False)
    assert (later.undated or 0.0) < recrawl.MAX_UNDATED
    assert later.rate() == recrawl.dated_rate(later.visits, later.changes,
                                              later.watched_s or 0.0)


def test_a_history_from_before_dates_counts_its_changes_undated() -> None:
    old = History(10.0, 4.0, 6000.0, 10**12, None)
    assert old.rate() == recrawl.change_rate(10.0, 4.0, 6000.0)
    after = old.visit(10**12 + 60_000, True, 10**12 + 30_000)
    assert after.undated == pytest.approx(4.0 * recrawl.DECAY)
    assert after.watched_s == pytest.approx(6000.0 * recrawl.DECAY + 30)
    assert after.rate() == recrawl.change_rate(after.visits, after.changes, after.covered_s)


def test_last_modified_is_read_as_an_http_date() -> None:
    assert Visit(last_modified="Wed, 21 Oct 2015 07:28:00 GMT").modified_ms == 1_445_412_480_000
    assert Visit(last_modified="Wed, 21 Oct 2015 07:28:00").modified_ms == 1_445_412_480_000
    for odd in ("yesterday", "Wed, 99 Oct 2015 07:28:00 GMT", None):
        visit = Visit(changed=True, last_modified=odd)
        assert visit.modified_ms is None and visit.settle_args(None)["modified_ms"] == ""
    assert Visit(last_modified="Wed, 21 Oct 2015 07:28:00 GMT").settle_args(None)[
        "modified_ms"] == "1445412480000"


def test_a_visit_refuses_validators_that_cannot_go_back_in_a_header() -> None:
    for bad in ({"etag": 'W/"a"\r\nSet-Cookie: x'}, {"etag": "x" * 513},
                {"last_modified": ""}, {"signature": 5}, {"changed": "yes"}):
        with pytest.raises(ValueError):
            Visit(**bad)  # type: ignore[arg-type]
    assert Visit(etag='W/"abc"', last_modified="Wed, 21 Oct 2015 07:28:00 GMT").reported


# ------------------------------------------------------------------ settle.lua
def _job(store: Store, **fields: object) -> Job:
    job = Job.from_dict({"id": "page", "task": "t", "interval_s": FIXED, "recrawl": "adaptive",
                         "min_interval_s": LOW, "max_interval_s": HIGH, **fields})
    store.upsert(job)
    return job


def _state(store: Store) -> RuntimeState:
    found = store.states(["page"])[0]
    assert found is not None
    return found


def _visit(store: Store, visit: Visit, gap_s: float | None = None) -> tuple[int, int | None]:
    """Run the job once; the last visit is made ``gap_s`` ago first (it is then at
    ``now - gap_s``, on the settle's clock). (now, next due)."""
    store.run_now("page")
    claimed = next(c for c in store.claim().jobs if c.job.id == "page")
    raw = json.loads(store.client.hget(store.keys.state, "page"))
    if gap_s is not None and "hl" in raw:
        # The last visit moved back by gap_s on Redis' clock: the settle below sees
        # a gap of gap_s plus the few ms between the two reads.
        raw["hl"] = store.now_ms() - round(gap_s * 1000)
        store.client.hset(store.keys.state, "page", json.dumps(raw))
    result = store.settle("page", claimed.occurrence, claimed.attempt, "complete", visit=visit)
    assert result.applied and result.now_ms is not None
    return result.now_ms, result.next_due_ms


def test_a_job_with_no_reports_keeps_its_fixed_cadence(store: Store) -> None:
    _job(store)
    for _ in range(3):
        now, due = _visit(store, Visit())
        assert due == now + FIXED * 1000
    assert _state(store).visits is None


def test_lua_and_python_agree_visit_by_visit(store: Store) -> None:
    _job(store, freshness_target=0.9)
    rng = random.Random(3)
    mirror = History()
    for step in range(40):
        changed = rng.random() < (0.7 if step < 20 else 0.1)
        gap = rng.uniform(60, 4000)
        now, due = _visit(store, Visit(changed=changed), gap)
        if mirror.last_visit_ms is not None:
            # The gap the script saw: from the last visit _visit wrote to its now.
            last = _state(store).covered_s or 0.0
            seen = last - mirror.covered_s * recrawl.DECAY
            mirror = History(mirror.visits, mirror.changes, mirror.covered_s,
                             now - round(seen * 1000), mirror.last_change_ms)
            assert seen == pytest.approx(gap, abs=0.2)
        mirror = mirror.visit(now, changed)
        state = _state(store)
        assert (state.visits or 0.0) == pytest.approx(mirror.visits, rel=1e-9)
        assert (state.changes or 0.0) == pytest.approx(mirror.changes, rel=1e-9, abs=1e-12)
        assert (state.covered_s or 0.0) == pytest.approx(mirror.covered_s, rel=1e-9)
        assert state.last_change_ms == mirror.last_change_ms
        expected = choose_interval_s(mirror.rate(), 0.9, LOW, HIGH, FIXED)
        assert state.recrawl_interval_ms == round(expected * 1000)
        assert due == now + state.recrawl_interval_ms


def test_lua_and_python_agree_on_dated_changes(store: Store) -> None:
    """Visits whose changes the page dates (Last-Modified, to the second) within their
    gap, one that dates it before the gap, and a change reported with no date: the
    script keeps the watched time and the undated count as the mirror does, and picks
    the estimate it does."""
    _job(store)
    _visit(store, Visit(changed=False))
    rng = random.Random(11)
    for step in range(30):
        gap = rng.uniform(120, 900)
        changed = step % 3 != 0
        before = _state(store)
        last = before.last_visit_ms or 0
        # The change dated 5-100 s before the visit (a date the settle puts inside
        # its gap), or, at steps 10 and 20, before the last visit and with none.
        back_s = rng.uniform(5, 100)
        date = None
        if changed and step != 20:
            date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(
                store.now_ms() / 1000 - (gap + 60 if step == 10 else back_s)))
        now, due = _visit(store, Visit(changed=changed, last_modified=date), gap)
        moved = (_state(store).last_visit_ms or 0)
        assert moved == now
        # The mirror, from the state before (its last visit moved back by the gap as
        # _visit did: read it back from what the script covered).
        seen_gap = (_state(store).covered_s or 0.0) - (before.covered_s or 0.0) * recrawl.DECAY
        mirror = recrawl.history_of(before)
        mirror = History(mirror.visits, mirror.changes, mirror.covered_s,
                         now - round(seen_gap * 1000), mirror.last_change_ms,
                         mirror.watched_s, mirror.undated)
        assert last >= mirror.last_visit_ms  # the helper moved it back, never forward
        mirror = mirror.visit(now, changed, Visit(last_modified=date).modified_ms)
        state = _state(store)
        assert (state.watched_s or 0.0) == pytest.approx(mirror.watched_s or 0.0, rel=1e-9)
        assert (state.undated or 0.0) == pytest.approx(mirror.undated or 0.0, rel=1e-9, abs=1e-12)
        expected = choose_interval_s(mirror.rate(), TARGET, LOW, HIGH, FIXED)
        assert state.recrawl_interval_ms == round(expected * 1000)
        assert due == now + state.recrawl_interval_ms
    # The undated changes of steps 10 and 20 still weigh: Cho's estimate is in use.
    final = recrawl.history_of(_state(store))
    assert (final.undated or 0.0) >= recrawl.MAX_UNDATED
    assert final.rate() == recrawl.change_rate(final.visits, final.changes, final.covered_s)


def test_lua_bounds_none_changed_then_all_changed(store: Store) -> None:
    _job(store)
    _visit(store, Visit(changed=False))
    for _ in range(5):
        _visit(store, Visit(changed=False), 600)
    assert _state(store).recrawl_interval_ms == HIGH * 1000
    for _ in range(120):
        gap = (_state(store).recrawl_interval_ms or 0) / 1000
        now, due = _visit(store, Visit(changed=True), gap)
    assert _state(store).recrawl_interval_ms == LOW * 1000 and due == now + LOW * 1000


def test_a_signature_unlike_the_last_one_is_a_change(store: Store) -> None:
    _job(store)
    _visit(store, Visit(signature="a"))
    assert _state(store).visits is None  # the baseline: nothing to compare with
    _visit(store, Visit(signature="a"), 600)
    _visit(store, Visit(signature="b"), 600)
    state = _state(store)
    assert state.visits == pytest.approx(1 + recrawl.DECAY)
    assert state.changes == pytest.approx(1.0) and state.signature == "b"


def test_validators_are_kept_and_an_empty_report_keeps_them(store: Store) -> None:
    _job(store)
    _visit(store, Visit(etag='"v1"', last_modified="Wed, 21 Oct 2015 07:28:00 GMT"))
    _visit(store, Visit(changed=False))
    state = _state(store)
    assert (state.etag, state.last_modified) == ('"v1"', "Wed, 21 Oct 2015 07:28:00 GMT")


def test_a_fixed_job_records_history_but_keeps_its_interval(store: Store) -> None:
    _job(store, recrawl="fixed", min_interval_s=None, max_interval_s=None)
    _visit(store, Visit(changed=True))
    now, due = _visit(store, Visit(changed=True), 60)
    assert due == now + FIXED * 1000
    state = _state(store)
    assert state.visits == 1 and state.recrawl_interval_ms is None


def test_a_retry_is_not_adapted(store: Store) -> None:
    _job(store, retry_base_s=5)
    _visit(store, Visit(changed=False))
    _visit(store, Visit(changed=False), 600)
    store.run_now("page")
    claimed = next(c for c in store.claim().jobs if c.job.id == "page")
    result = store.settle("page", claimed.occurrence, 1, "error", error="HTTP 500",
                          visit=Visit(changed=False))
    assert result.status == "scheduled" and result.label == "retrying"
    assert result.now_ms is not None and result.next_due_ms == result.now_ms + 5000


def test_concurrent_settles_of_one_occurrence_record_one_visit(store: Store) -> None:
    _job(store)
    _visit(store, Visit(changed=False))
    store.run_now("page")
    claimed = next(c for c in store.claim().jobs if c.job.id == "page")
    barrier = threading.Barrier(8)
    applied: list[bool] = []

    def settle() -> None:
        barrier.wait()
        applied.append(store.settle("page", claimed.occurrence, claimed.attempt, "complete",
                                    visit=Visit(changed=True)).applied)

    threads = [threading.Thread(target=settle) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(applied) == [False] * 7 + [True]
    state = _state(store)
    assert state.visits == 1 and state.changes == 1


# ------------------------------------------------------------ conditional fetches
def test_a_claim_carries_the_last_visits_validators_in_the_message_headers(store: Store) -> None:
    _job(store)
    _visit(store, Visit(etag='W/"7"', last_modified="Wed, 21 Oct 2015 07:28:00 GMT",
                        signature="abc"))
    store.run_now("page")
    claimed = next(c for c in store.claim().jobs if c.job.id == "page")
    headers = claimed.headers()
    assert (headers["zsched_etag"], headers["zsched_last_modified"],
            headers["zsched_signature"]) == ('W/"7"', "Wed, 21 Oct 2015 07:28:00 GMT", "abc")


def test_validators_become_conditional_request_headers_and_forged_ones_are_dropped() -> None:
    from celery_zsched.worker.validators import validators

    class Request:
        def __init__(self, headers: dict[str, object]) -> None:
            self.headers = headers

    assert validators(Request({"zsched_etag": 'W/"7"', "zsched_signature": "abc",
                               "zsched_last_modified": "Wed, 21 Oct 2015 07:28:00 GMT"})) == {
        "If-None-Match": 'W/"7"', "If-Modified-Since": "Wed, 21 Oct 2015 07:28:00 GMT"}
    assert validators(Request({"zsched_etag": '"a"\r\nX-Evil: 1',
                               "zsched_last_modified": 5})) == {}


def test_a_failed_task_reports_a_304_as_a_visit_without_change() -> None:
    from celery_zsched.core.errors import JobFailed
    from celery_zsched.worker.validators import visit_of

    assert visit_of(JobFailed("HTTP 304", status=304), 304) == Visit(changed=False)
    assert visit_of(JobFailed("boom"), None) is None
    # A bad validator never keeps the error from settling: the visit is dropped.
    assert visit_of(JobFailed("x", etag="\n"), 500) is None


# ------------------------------------------------------------------ showing it
def _taught(store: Store) -> None:
    _job(store)
    _visit(store, Visit(changed=False))
    for changed in (True, False, False, True, False):
        _visit(store, Visit(changed=changed), 600)


def test_the_exporter_reports_fleet_freshness_and_age_from_sampled_states(store: Store) -> None:
    from prometheus_client import CollectorRegistry

    from celery_zsched.core.recrawl import estimate
    from celery_zsched.metrics.exporter import StoreCollector

    _taught(store)
    store.upsert(Job.from_dict({"id": "quiet", "task": "t", "interval_s": 60}))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    values = {s.name: s.value for family in registry.collect() for s in family.samples
              if not s.labels or s.labels.get("le") == "+Inf"}
    expected = estimate(_state(store))
    assert expected is not None and 0 < expected.freshness < 1
    assert values["zsched_recrawl_sampled_jobs"] == 2
    assert values["zsched_recrawl_estimated_jobs"] == 1
    assert values["zsched_fleet_freshness_ratio"] == pytest.approx(expected.freshness)
    assert values["zsched_fleet_age_seconds"] == pytest.approx(expected.age_s)
    assert values["zsched_recrawl_interval_seconds_bucket"] == 1


def test_show_and_the_rest_view_carry_the_rate_interval_and_last_change(store: Store) -> None:
    from celery_zsched.core.recrawl import summary
    from celery_zsched.server.views import job_view

    _taught(store)
    info = store.get("page")
    now = store.now_ms()
    seen = summary(info.job, info.state, now)
    assert seen["recrawl"] == "adaptive" and seen["change_rate_per_day"] > 0
    assert seen["estimator"] == "change-or-not"  # its changes came without dates
    assert seen["interval_s"] == (info.state.recrawl_interval_ms or 0) / 1000
    assert 0 <= seen["since_last_change_s"] < 60
    view = job_view(store, info, now_ms=now)
    assert view.recrawl is not None and view.recrawl.interval_s == seen["interval_s"]
    assert view.recrawl.change_rate_per_day == pytest.approx(seen["change_rate_per_day"])
    assert view.recrawl.estimator == "change-or-not"


def test_the_next_fires_of_an_adaptive_job_follow_its_chosen_interval(store: Store) -> None:
    from celery_zsched.services.preview import preview_info

    _taught(store)
    info = store.get("page")
    fires = preview_info(info, store.now_ms(), 3, store.settings).fires
    step = info.state.recrawl_interval_ms
    assert step is not None and step != FIXED * 1000
    assert fires[2].utc_ms - fires[1].utc_ms == step


def test_chos_allocation_spends_the_budget_and_beats_a_fixed_interval() -> None:
    rng = random.Random(22)
    rates = [10 ** rng.uniform(-4, -1) for _ in range(200)]
    budget = len(rates) / 600  # a fixed interval of 600 s
    mu = recrawl.solve_mu(rates, budget, 6, 60_000)
    intervals = [recrawl.allocation_interval_s(r, mu, 6, 60_000) for r in rates]
    assert sum(1 / i for i in intervals) == pytest.approx(budget, rel=1e-3)
    allocated = sum(freshness(r, i) for r, i in zip(rates, intervals, strict=True))
    fixed = sum(freshness(r, 600) for r in rates)
    assert allocated > fixed
    # The fastest pages are not worth their fetches: they get the upper bound.
    assert recrawl.allocation_interval_s(max(rates), mu * 1e6, 6, 60_000) == 60_000
