"""The Celery application as the worker and beat run it: ``celery -A worker.celery_app``.

The configuration and the task names are the web tier's (``app/broker/task_queue.py``); the worker
adds what only it needs: surviving a Redis restart in-process (``worker.broker_fixes``), the
logging/metrics signal handlers, and the heartbeats that ``/readyz`` and the container health
checks read.
"""

from __future__ import annotations

from celery.signals import beat_init, worker_ready, worker_shutdown

from app.broker.task_queue import (  # noqa: F401 - the worker's modules take the names from here
    AUDIT_CHECKPOINT,
    DATA_MAINTENANCE,
    HANDLE_MESSAGE,
    SIEM_EXPORT,
    SWEEP_OUTBOX,
    make_celery,
)
from app.config import get_settings
from worker import broker_fixes
from worker.observability import (
    heartbeat,
    signals,  # noqa: F401 - connects the logging/metrics signal handlers
)

broker_fixes.apply()  # the worker survives a Redis restart in-process (see the module)


# The heartbeats /readyz and the container health checks read (worker/observability/heartbeat.py);
# these signals fire only inside ``celery worker`` and ``celery beat``, never in the web process.
@worker_ready.connect(weak=False, dispatch_uid="wecom-bot.heartbeat.worker_ready")
def _start_worker_heartbeat(sender=None, **_):
    settings = get_settings()
    heartbeat.start("worker", sender.hostname, settings.redis_url, settings.worker_heartbeat_ttl_s)


@worker_shutdown.connect(weak=False, dispatch_uid="wecom-bot.heartbeat.worker_shutdown")
def _stop_worker_heartbeat(sender=None, **_):
    heartbeat.stop("worker")


@beat_init.connect(weak=False, dispatch_uid="wecom-bot.heartbeat.beat_init")
def _start_beat_heartbeat(sender=None, **_):
    settings = get_settings()
    heartbeat.start("beat", heartbeat.default_node("beat"), settings.redis_url,
                    settings.worker_heartbeat_ttl_s)


def __getattr__(name: str):
    # Built on first use so that importing this module never reads the environment; the
    # celery CLI (-A worker.celery_app) finds the app as ``celery``.
    if name in ("celery", "app"):
        global celery
        celery = make_celery(get_settings())
        return celery
    raise AttributeError(name)
