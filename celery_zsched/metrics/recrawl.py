"""Fleet-wide freshness and age (Cho's definitions), estimated from a random sample of
job states on each scrape.

A per-job series would be one per job; the fleet's figures come instead from
``HRANDFIELD`` over each partition's runtime states (:data:`SAMPLE` a
partition), so a scrape's cost does not grow with the fleet. For each sampled
job with a change-rate estimate (its visits reported changed or not), the
expected freshness ``(1 - e^{-λI}) / (λI)`` and age are taken at its current
interval: an adaptive job's chosen one, else the mean interval its visits
actually covered (pacing delays included). See :mod:`celery_zsched.core.recrawl`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily, Metric

from celery_zsched.core.recrawl import estimate
from celery_zsched.core.state import RuntimeState

#: Runtime states sampled per partition and scrape.
SAMPLE = 2000
#: Buckets (s) of the current-interval histogram: a minute to a week.
INTERVAL_BUCKETS = (60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 86_400.0, 7 * 86_400.0)
#: Buckets (changes a day) of the change-rate histogram.
RATE_BUCKETS = (0.01, 0.1, 1.0, 10.0, 100.0, 1000.0)


def sample_states(replies: Iterable[Sequence[object] | None]) -> list[RuntimeState]:
    """Decode ``HRANDFIELD ... WITHVALUES`` replies (flat id, state pairs)."""
    states = []
    for reply in replies:
        flat = list(reply or ())
        states += [RuntimeState.from_wire(str(raw)) for raw in flat[1::2]]
    return states


def fleet_families(states: Sequence[RuntimeState]) -> Iterator[Metric]:
    """The fleet's recrawl metrics from sampled ``states``."""
    found = [e for e in map(estimate, states) if e is not None]
    yield GaugeMetricFamily("zsched_recrawl_sampled_jobs",
                            "Job states sampled this scrape for the recrawl metrics.",
                            value=len(states))
    yield GaugeMetricFamily("zsched_recrawl_estimated_jobs",
                            "Sampled jobs with a change-rate estimate (their visits report "
                            "changed or not).", value=len(found))
    mean = (lambda xs: sum(xs) / len(found)) if found else (lambda xs: 0.0)
    yield GaugeMetricFamily("zsched_fleet_freshness_ratio",
                            "Estimated expected freshness over the sampled jobs with an "
                            "estimate (Cho: share of time a copy equals its page; 0: none).",
                            value=mean([e.freshness for e in found]))
    yield GaugeMetricFamily("zsched_fleet_age_seconds",
                            "Estimated expected age of a copy over the sampled jobs with an "
                            "estimate (Cho: time since it went stale; 0 while fresh).",
                            value=mean([e.age_s for e in found]))
    yield _histogram("zsched_recrawl_interval_seconds",
                     "Current intervals of the sampled jobs with an estimate.",
                     INTERVAL_BUCKETS, [e.interval_s for e in found])
    yield _histogram("zsched_recrawl_change_rate_per_day",
                     "Estimated change rates (changes a day) of the sampled jobs.",
                     RATE_BUCKETS, [e.rate * 86_400 for e in found])


def _histogram(name: str, doc: str, bounds: Sequence[float],
               values: Sequence[float]) -> GaugeHistogramMetricFamily:
    buckets = [(str(bound), sum(1 for v in values if v <= bound)) for bound in bounds]
    buckets.append(("+Inf", len(values)))
    return GaugeHistogramMetricFamily(name, doc, buckets=buckets, gsum_value=sum(values))
