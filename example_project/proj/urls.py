"""URLs: the admin, and the local scrape targets the sample jobs fetch."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/zsched/zschedjob/", permanent=False)),
    path("admin/", admin.site.urls),
    path("targets/", include("scrapers.urls")),
]
