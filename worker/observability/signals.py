"""Celery signal handlers: JSON logs with the request id, and the worker's metrics endpoint.

Imported by ``worker.celery_app`` so the worker and beat processes pick them up; in the web
process (which imports the Celery app only to publish) none of these signals fire.
"""

from __future__ import annotations

import logging

from celery import signals

from app import logging_setup

# Celery's "Task ... received" line, written by the consumer's thread for every task before the
# task runs (so without its request id): the processor logs one line a message with its id,
# outcome and latency ("message finished"), and Celery's own "succeeded" line follows with the
# request id, so at INFO this one only cost the consumer thread its time (about 2 % of the
# worker's CPU under bench.load). LOG_LEVEL=DEBUG brings it back.
PER_TASK_LOGGERS = ("celery.worker.strategy",)


@signals.setup_logging.connect
def _configure_logging(**_):
    """Replace Celery's logging with ours (``LOG_FORMAT``, ``LOG_LEVEL``, redaction)."""
    from app.config import get_settings

    handler = logging_setup.configure(get_settings())
    quiet = logging.getLogger().getEffectiveLevel() > logging.DEBUG
    for name in PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING if quiet else logging.NOTSET)
    return handler


@signals.task_prerun.connect
def _bind_request_id(task=None, **_):
    """The callback's request id travels in the task headers (``app.outbox.publisher.publish_tasks``)."""
    request = getattr(task, "request", None)
    incoming = getattr(request, "request_id", None)
    if incoming is None:
        incoming = (getattr(request, "headers", None) or {}).get("request_id")
    logging_setup.request_id_var.set(logging_setup.clean_request_id(incoming))


@signals.task_postrun.connect
def _unbind_request_id(**_):
    logging_setup.request_id_var.set(None)


@signals.worker_init.connect
def _serve_metrics(**_):
    from app.config import get_settings
    from worker.observability import metrics

    settings = get_settings()
    metrics.serve(settings.metrics_port, settings.metrics_addr)
