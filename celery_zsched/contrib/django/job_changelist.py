"""The job changelist's live Redis state: one round trip per page, on first use.

The changelist fetches the live Redis state of the rows on its page with one
:meth:`Store.get_many` call, when the first row is rendered, and caches it on
each row; the change page fetches its one job the same way. Sorting by next
run reads the page from the Redis schedule (:mod:`.next_run_order`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib import messages
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest

from celery_zsched.contrib.django.conf import get_store
from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.contrib.django.next_run_order import next_run_page
from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.store import Store

#: Attribute of a row instance that holds its live Redis state for this request.
#: Set per instance (never on the shared ModelAdmin), so concurrent requests
#: of a threaded server cannot see each other's rows.
INFO_ATTR = "_zsched_info"
#: Attribute of a row instance that links it to the other rows of its page.
PAGE_ATTR = "_zsched_page"
#: Placeholder for "the Redis read failed", distinct from "no such job" (None).
UNAVAILABLE = object()


def attach_infos(store: Store, rows: Sequence[ZSchedJob]) -> None:
    """Fetch the live state of ``rows`` in one round trip and cache it on each row."""
    try:
        infos: list[Any] = list(store.get_many([row.job_id for row in rows]))
    except StoreUnavailable:
        infos = [UNAVAILABLE] * len(rows)
    for row, info in zip(rows, infos, strict=True):
        setattr(row, INFO_ATTR, info)


def info_of(row: ZSchedJob) -> Any:
    """The row's cached :class:`JobInfo`, fetched with its page on first use.

    ``None`` when the job is not in Redis, :data:`UNAVAILABLE` when Redis
    could not be reached.
    """
    if INFO_ATTR not in row.__dict__:
        page: _Page | None = row.__dict__.get(PAGE_ATTR)
        if page is not None:
            page.load()
        else:
            attach_infos(get_store(), [row])
    return row.__dict__[INFO_ATTR]


class _Page:
    """The rows of one changelist page; the first row rendered loads them all."""

    def __init__(self, rows: list[ZSchedJob]) -> None:
        self.rows = rows
        self.loaded = False

    def load(self) -> None:
        if not self.loaded:
            self.loaded = True
            attach_infos(get_store(), self.rows)


class ZSchedChangeList(ChangeList):
    """A changelist that reads its page's Redis state with one ``get_many`` call.

    Lazily: the read happens when the first row is rendered, so requests that
    build a changelist without rendering it (an action POST) cost no round trip.
    """

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        descending = self._next_run_sort()
        if descending is not None:
            # The database cannot sort by next run: the page comes from Redis.
            if self.show_all and self.can_show_all:
                offset, limit = 0, self.result_count
            else:
                offset, limit = (self.page_num - 1) * self.list_per_page, self.list_per_page
            try:
                sorted_page = next_run_page(self.queryset, offset, limit,
                                            descending=descending, count=self.result_count)
            except StoreUnavailable as exc:
                messages.error(request, f"Cannot sort by next run: {exc}")
            else:
                self.result_list = sorted_page.rows
                if sorted_page.truncated_after:
                    messages.warning(request, "Sorting by next run stopped after "
                                     f"{sorted_page.truncated_after:,} scheduled jobs, "
                                     "before this page was full: narrow the filters.")
        # Iterating the page's queryset fills its result cache, so the template
        # later renders these very instances.
        rows = list(self.result_list)
        page = _Page(rows)
        for row in rows:
            row.__dict__[PAGE_ATTR] = page

    def _next_run_sort(self) -> bool | None:
        """``descending`` when next run is the first sort column, else ``None``."""
        columns = self.get_ordering_field_columns()
        first = next(iter(columns.items()), None)
        # ?o= is the user's: an index past the columns sorts by nothing, as Django's own
        # ordering ignores it.
        if first is None or not 0 <= first[0] < len(self.list_display) \
                or self.list_display[first[0]] != "next_run":
            return None
        return first[1] == "desc"
