"""Optional integrations of celery-zsched with other frameworks (installed through extras)."""
