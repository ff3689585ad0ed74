"""The Django app of celery-zsched: ``INSTALLED_APPS += ["celery_zsched.contrib.django"]``.

The database row (:class:`~celery_zsched.contrib.django.models.ZSchedJob`) is the
durable definition of a job; Redis holds its timing state and a copy of the
definition, written after each commit. Beat never reads the database.
Installed with the ``django`` extra: ``pip install celery-zsched[django]``.
"""
