"""The Celery application: Redis broker, at-least-once delivery, JSON only.

``acks_late`` + ``task_reject_on_worker_lost`` + prefetch 1 mean a task is acknowledged only after
it ran, so a worker that dies mid-task loses nothing; the task itself is idempotent (see
``worker.processor``). The web process uses the same app to publish by task name and never
imports the task code (or the model).
"""

from __future__ import annotations

from celery import Celery
from celery.signals import beat_init, worker_ready, worker_shutdown

from app.config import Settings, get_settings
from worker import (
    broker,
    broker_fixes,
    heartbeat,
    observability,  # noqa: F401 - connects the logging/metrics signal handlers
)

broker_fixes.apply()  # the worker survives a Redis restart in-process (see the module)
broker.install()  # redis:// keeps one Redis client per channel (see the module)

HANDLE_MESSAGE = "worker.tasks.handle_message"
SWEEP_OUTBOX = "worker.tasks.sweep_outbox"
DATA_MAINTENANCE = "worker.tasks.data_maintenance"
AUDIT_CHECKPOINT = "worker.tasks.audit_checkpoint"


def make_celery(settings: Settings) -> Celery:
    app = Celery("wecom_bot", include=["worker.tasks"])
    app.conf.update(
        broker_url=settings.celery_broker_url,
        task_ignore_result=True,
        result_backend=None,
        task_serializer="json",
        accept_content=["json"],
        timezone="Asia/Shanghai",
        enable_utc=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue="chat",
        broker_connection_retry_on_startup=True,
        # A lost broker connection is re-established in-process (worker.broker_fixes keeps the
        # teardown from crashing), for as long as Redis is away: the worker can do nothing
        # without it, and a supervisor restarting the process would not bring Redis back.
        broker_connection_retry=True,
        broker_connection_max_retries=None,
        # Tasks running when the connection drops finish (their answer is idempotent, a
        # redelivered copy finds the row leased or answered); cancelling would throw away a
        # generation, and the threads pool cannot stop a running thread anyway.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        broker_connection_timeout=2,
        # A publish must fail fast when Redis is down: the outbox row stays queued and the
        # sweeper re-enqueues it, so the callback never blocks WeCom's 5-second window.
        task_publish_retry=True,
        task_publish_retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0.1,
                                   "interval_max": 0.1},
        broker_transport_options={
            "visibility_timeout": 600,
            "socket_timeout": 2,
            "socket_connect_timeout": 1,
        },
        beat_schedule={
            "sweep-outbox": {"task": SWEEP_OUTBOX, "schedule": settings.sweep_interval_s},
            "data-maintenance": {"task": DATA_MAINTENANCE, "schedule": 3600.0},
            # A sealed checkpoint event: 'audit verify' then reports a head older than twice
            # this (a tail cut off and an old head put back). 0 turns both off.
            **({"audit-checkpoint": {"task": AUDIT_CHECKPOINT,
                                     "schedule": settings.audit_checkpoint_minutes * 60.0}}
               if settings.audit_checkpoint_minutes else {}),
        },
    )
    return app


# The heartbeats /readyz and the container health checks read (worker/heartbeat.py); these
# signals fire only inside ``celery worker`` and ``celery beat``, never in the web process.
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
