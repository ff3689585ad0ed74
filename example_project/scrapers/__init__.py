"""The example's scrapers: one Celery task, and local fake feeds for it to fetch."""
