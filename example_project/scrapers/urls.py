"""``/targets/<kind>/<n>.xml``: the fake feeds of :mod:`scrapers.views`."""

from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("feed/<int:n>.xml", views.feed, name="target-feed"),
    path("slow/<int:n>.xml", views.slow, name="target-slow"),
    path("error/<int:n>.xml", views.error, name="target-error"),
    path("ratelimited/<int:n>.xml", views.ratelimited, name="target-ratelimited"),
    path("flaky/<int:n>.xml", views.flaky, name="target-flaky"),
]
