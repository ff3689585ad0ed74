"""Which partition holds a job: the placement rule, and the layout record that names it.

With one partition, or pacing off, a job lives in ``partition_of(id, P)``.
With pacing on and several partitions, a paced job lives in its *domain's*
partition, ``partition_of(domain, P)``: the claim, the start gate and the
domain's pacing state then share one Redis Cluster slot, so one script checks
them together. A job without a domain stays by id. The rule depends on the
settings (``zsched_partitions``, ``zsched_pacing``, ``zsched_domain_registrable``),
so the layout record names it as well as the count, and a process whose
settings would place jobs elsewhere refuses to start (``zsched repartition``
moves them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery_zsched.core.domains import domain_of
from celery_zsched.core.job import Job
from celery_zsched.store.keys import partition_of

#: Placement rules: by id; by domain (host); by registrable domain (eTLD+1).
BY_ID, BY_DOMAIN, BY_REGISTRABLE = "id", "domain", "registrable"


@dataclass(frozen=True)
class Layout:
    """A partition count and the rule that places jobs among the partitions."""

    count: int
    rule: str = BY_ID

    @classmethod
    def of(cls, settings: Any) -> Layout:
        """The layout ``settings`` ask for."""
        count = max(1, int(settings.partitions))
        if count == 1 or not settings.pacing:
            return cls(count)
        return cls(count, BY_REGISTRABLE if settings.domain_registrable else BY_DOMAIN)

    @classmethod
    def parse(cls, text: str) -> Layout:
        """The layout of a record: ``"P"`` (by id, as before placement rules) or ``"P/rule"``."""
        count, _, rule = text.partition("/")
        layout = cls(int(count), rule or BY_ID)
        if layout.rule not in (BY_ID, BY_DOMAIN, BY_REGISTRABLE) or layout.count < 1:
            raise ValueError(f"not a store layout: {text!r}")
        return layout

    def __str__(self) -> str:
        return str(self.count) if self.rule == BY_ID else f"{self.count}/{self.rule}"

    def describe(self) -> str:
        """For messages: "12 partitions, paced jobs by domain"."""
        placed = {BY_ID: "jobs by id", BY_DOMAIN: "paced jobs by domain",
                  BY_REGISTRABLE: "paced jobs by registrable domain"}[self.rule]
        return f"{self.count} partition{'s' if self.count != 1 else ''}, {placed}"

    @property
    def by_domain(self) -> bool:
        """Whether paced jobs live in their domain's partition (ids need the directory)."""
        return self.rule != BY_ID

    def home(self, job_id: str, domain: str | None) -> int:
        """The partition ``job_id`` belongs in, paced under ``domain`` (``None``: not paced)."""
        if domain and self.by_domain:
            return partition_of(domain, self.count)
        return partition_of(job_id, self.count)

    def domain_for(self, raw: str | None) -> str | None:
        """The domain a stored definition (JSON) is placed by under this layout
        (``None``: placed by id)."""
        if raw is None or not self.by_domain:
            return None
        job = Job.from_json(raw)
        return domain_of(job.url, job.domain, group_registrable=self.rule == BY_REGISTRABLE)

    def home_of(self, job_id: str, raw: str | None) -> int:
        """:meth:`home` of a stored definition (JSON)."""
        return self.home(job_id, self.domain_for(raw))

    def domain_home(self, domain: str) -> int:
        """The partition that holds ``domain``'s pacing state (and its jobs)."""
        return partition_of(domain, self.count) if self.by_domain else 0
