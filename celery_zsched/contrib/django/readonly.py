"""Read-only admin for the records a job leaves behind (its runs, its changes).

They are written only by the drains that copy them from Redis, so nobody adds,
edits or deletes them in the admin; whoever may see jobs may see them.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from celery_zsched.contrib.django.models import ZSchedJob


def can_view_jobs(request: HttpRequest) -> bool:
    """Whether the user may see jobs (view or change permission)."""
    opts = ZSchedJob._meta
    return bool(request.user.has_perm(f"{opts.app_label}.view_{opts.model_name}")
                or request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}"))


class JobRecordsReadOnly:
    """Mixin for a ModelAdmin or an inline of run or change records."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return can_view_jobs(request)
