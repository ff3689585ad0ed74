"""Cho's budget allocation (zsched_recrawl_allocation): the planner solves each paced
domain's multiplier from its adaptive pages' rates and its capacity and stores it;
settle.lua reads it (real Redis) and sets the interval within the job's bounds, and
falls back to the freshness target without one."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable

import pytest

from celery_zsched.core import recrawl
from celery_zsched.core.job import Job
from celery_zsched.core.recrawl import Visit, allocation_interval_s, choose_interval_s
from celery_zsched.core.state import RuntimeState
from celery_zsched.services import planner
from celery_zsched.store import Store

Make = Callable[..., Store]
HOST = "alloc.example"
LOW, HIGH, FIXED = 60.0, 86_400.0, 600.0


# ------------------------------------------------------------------ pure
def test_the_multiplier_spends_the_budget_over_pages_of_their_own_bounds() -> None:
    pages = Counter({(1e-4, 60.0, 86_400.0): 30, (1e-3, 60.0, 86_400.0): 10,
                     (1e-5, 600.0, 7_200.0): 5})
    for budget in (0.01, 0.05, 0.2):
        mu = recrawl.solve_mu_pages(pages, budget)
        spent = sum(n / allocation_interval_s(r, mu, lo, hi) for (r, lo, hi), n in pages.items())
        assert spent == pytest.approx(budget, rel=1e-3)
    # No budget: every page at its upper bound; all the budget in the world: its lower.
    starved = recrawl.solve_mu_pages(pages, 1e-12)
    assert {allocation_interval_s(r, starved, lo, hi) for (r, lo, hi) in pages} == {86_400, 7_200}
    flush = recrawl.solve_mu_pages(pages, 1e6)
    assert {allocation_interval_s(r, flush, lo, hi) for (r, lo, hi) in pages} == {60, 600}


def test_the_policy_asks_for_the_allocation_only_when_set() -> None:
    job = Job.from_dict({"url": f"http://{HOST}/", "interval_s": FIXED, "recrawl": "adaptive"})
    assert "a" not in (recrawl.recrawl_policy(job, 0.8, 0) or {})
    assert (recrawl.recrawl_policy(job, 0.8, 0, allocation=True) or {})["a"] == 1


# ------------------------------------------------------------------ settle.lua
def _store(make_store: Make, **overrides: object) -> Store:
    # A zero delay lets one test run a page back to back; the domain is still paced
    # (its in-flight fetch names it, which is how the settle finds its multiplier).
    return make_store(**{"pacing": True, "domain_delay_s": 0, "recrawl_allocation": True,
                         **overrides})


def _page(store: Store, job_id: str = "page") -> Job:
    job = Job.from_dict({"id": job_id, "url": f"http://{HOST}/{job_id}", "interval_s": FIXED,
                         "recrawl": "adaptive", "min_interval_s": LOW,
                         "max_interval_s": HIGH, "jitter_s": 0})
    store.upsert(job)
    return job


def _visit(store: Store, changed: bool, job_id: str = "page", gap_s: float = 600) -> RuntimeState:
    """One run of ``job_id`` that saw (or did not see) a change, ``gap_s`` after the last."""
    store.run_now(job_id)
    claims = store.claim().jobs
    assert job_id in {c.job.id for c in claims}
    for claimed in claims:  # others that fell due are settled without a report
        keys = store.part_of(claimed.job.id)
        raw = json.loads(store.client.hget(keys.state, claimed.job.id))
        assert raw.get("fd") == HOST
        if "hl" in raw:
            raw["hl"] = store.now_ms() - round(gap_s * 1000)
            store.client.hset(keys.state, claimed.job.id, json.dumps(raw))
        visit = Visit(changed=changed) if claimed.job.id == job_id else Visit()
        assert store.settle(claimed.job.id, claimed.occurrence, claimed.attempt, "complete",
                            visit=visit).applied
    state = store.states([job_id])[0]
    assert state is not None
    return state


def _rate(state: RuntimeState) -> float:
    rate = recrawl.history_of(state).rate()
    assert rate is not None
    return rate


def _set_mu(store: Store, mu: float) -> None:
    store.client.hset(store.domain_keys(HOST).recrawl_mu, HOST, repr(mu))


def test_without_a_multiplier_the_settle_keeps_the_freshness_target(make_store: Make) -> None:
    store = _store(make_store)
    _page(store)
    _visit(store, True)
    for changed in (True, False, True, False):
        state = _visit(store, changed)
        expected = choose_interval_s(_rate(state), 0.8, LOW, HIGH, FIXED)
        assert state.recrawl_interval_ms == round(expected * 1000)


def test_the_settle_follows_the_domains_multiplier_as_it_changes(make_store: Make) -> None:
    store = _store(make_store)
    _page(store)
    _visit(store, True)
    _visit(store, False)
    seen = []
    for mu in (50.0, 500.0, 2_000.0):
        _set_mu(store, mu)
        state = _visit(store, True)
        expected = allocation_interval_s(_rate(state), mu, LOW, HIGH)
        assert state.recrawl_interval_ms == pytest.approx(expected * 1000, abs=1)
        assert expected != choose_interval_s(_rate(state), 0.8, LOW, HIGH, FIXED)
        seen.append(state.recrawl_interval_ms)
    # A larger multiplier prices a fetch higher: the page is fetched less often.
    assert seen == sorted(seen) and len(set(seen)) == 3


def test_the_allocation_stays_within_the_bounds(make_store: Make) -> None:
    store = _store(make_store)
    _page(store)
    _visit(store, True)
    _set_mu(store, 1e9)  # mu * rate >= 1: not worth a fetch
    assert _visit(store, True).recrawl_interval_ms == HIGH * 1000
    _set_mu(store, 1e-9)  # fetches are free: as often as the bounds let it
    assert _visit(store, True).recrawl_interval_ms == LOW * 1000


def test_a_store_without_the_setting_ignores_a_multiplier(make_store: Make) -> None:
    store = _store(make_store, **{"recrawl_allocation": False})
    _page(store)
    _visit(store, True)
    _set_mu(store, 1e9)
    state = _visit(store, True)
    assert state.recrawl_interval_ms == round(
        choose_interval_s(_rate(state), 0.8, LOW, HIGH, FIXED) * 1000)


# ------------------------------------------------------------------ the planner
def test_the_planner_stores_a_multiplier_that_spends_the_domains_capacity(
        make_store: Make) -> None:
    teach = _store(make_store)
    ids = [f"p{i}" for i in range(6)]
    for i, job_id in enumerate(ids):  # one at a time: the others wait their interval
        _page(teach, job_id)
        _visit(teach, True, job_id)
        for step in range(4):
            _visit(teach, step < i % 3, job_id)  # three different change rates
    teach.upsert(Job.from_dict({"id": "fixed", "url": f"http://{HOST}/fixed",
                                "interval_s": 120, "jitter_s": 0}))
    # The same store paced at 30 s: 2,880 fetches a day, 720 of them the fixed job's.
    paced = make_store(pacing=True, domain_delay_s=30, recrawl_allocation=True,
                       key_prefix=teach.settings.key_prefix)
    result = planner.demand(paced, fresh=True)
    mu = float(paced.client.hget(paced.domain_keys(HOST).recrawl_mu, HOST))
    states = paced.states(ids)
    spent = sum(1 / allocation_interval_s(_rate(s), mu, LOW, HIGH) for s in states if s)
    assert spent == pytest.approx(1 / 30 - 1 / 120, rel=0.01)
    assert sum(result.pages[HOST].pages.values()) == len(ids)
    # A domain with no adaptive pages left loses its multiplier.
    for job_id in ids:
        paced.delete(job_id)
    planner.demand(paced, fresh=True)
    assert paced.client.hget(paced.domain_keys(HOST).recrawl_mu, HOST) is None
