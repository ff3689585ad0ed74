"""The beat scheduler (``-S celery_zsched``): its ticks, the partitions each one visits,
the publishing of what it claims, and the sweep of a Redis broker's unacked messages."""
