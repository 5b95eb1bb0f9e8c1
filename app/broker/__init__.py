"""Celery over Redis: ``task_queue`` (the Celery app both tiers share, task names) and
``transport`` (Kombu's Redis transport with one client per channel)."""
