"""Changelist filters of the job admin: failing, last status, queue and dead-lettered jobs."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from celery_zsched.contrib.django.conf import get_store
from celery_zsched.contrib.django.models import RunStatus
from celery_zsched.core.errors import StoreUnavailable

#: Dead letters the filter reads (the newest first). Dead letters pile up only
#: from crashed executions, and the Dead letters page acts on any number.
DEAD_FILTER_MAX = 10_000
#: The value of the queue filter's choice for jobs without a queue of their own.
DEFAULT_QUEUE = "-"


class DeadLetteredFilter(admin.SimpleListFilter):
    """Jobs in (or out of) the Redis dead-letter set; one ZREVRANGE per partition."""

    title = "dead-lettered"
    parameter_name = "dead"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Dead-lettered"), ("no", "Not dead-lettered")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() not in ("yes", "no"):
            return None
        try:
            ids = get_store().dead_ids(DEAD_FILTER_MAX)
        except StoreUnavailable as exc:
            messages.error(request, f"Cannot filter by dead letters: {exc}")
            return queryset.none()
        if self.value() == "yes":
            return queryset.filter(job_id__in=ids)
        return queryset.exclude(job_id__in=ids)


class QueueFilter(admin.SimpleListFilter):
    """The job's queue; jobs without one are "default queue", never a blank choice."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        queues = (model_admin.get_queryset(request).exclude(queue="")
                  .order_by("queue").values_list("queue", flat=True).distinct())
        return [(DEFAULT_QUEUE, "Default queue (none set)"), *((q, q) for q in queues)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value == DEFAULT_QUEUE:
            return queryset.filter(queue="")
        if value:
            return queryset.filter(queue=value)
        return None


class FailingFilter(admin.SimpleListFilter):
    """Jobs whose latest settles failed (``consecutive_failures > 0`` in the mirror)."""

    title = "failing"
    parameter_name = "failing"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Failing now"), ("no", "Not failing")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() == "yes":
            return queryset.filter(consecutive_failures__gt=0)
        if self.value() == "no":
            return queryset.filter(consecutive_failures=0)
        return None


class LastStatusFilter(admin.SimpleListFilter):
    """The last settle label, with "never run" for rows without one."""

    title = "last status"
    parameter_name = "last_status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [*RunStatus.choices, ("none", "Never run")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value == "none":
            return queryset.filter(last_status="")
        if value:
            return queryset.filter(last_status=value)
        return None
