"""Jobs, timing, validation, the runtime state, results, domains, audit values and file
formats: plain Python, with no Redis, Celery or Django (the layers' contract in
``pyproject.toml`` forbids them here)."""
