"""The Celery application the web tier publishes to and the worker runs: Redis broker,
at-least-once delivery, JSON only, and the task names.

Built here, in ``app`` (Flask's ``celery_init_app`` pattern, without the tasks): the web
process publishes by task name and never imports the task code, the worker's runtime (its
Redis-restart fix, its heartbeats) or the model; ``worker.celery_app`` adds those to this same
configuration for ``celery -A worker.celery_app``. ``acks_late`` + ``task_reject_on_worker_lost``
+ prefetch 1 mean a task is acknowledged only after it ran, so a worker that dies mid-task loses
nothing; the task itself is idempotent (see ``worker.processor``).
"""

from __future__ import annotations

from celery import Celery
from kombu import Exchange, Queue

from app import redis_client
from app.broker import transport as broker
from app.config import Settings

HANDLE_MESSAGE = "worker.tasks.handle_message"
SWEEP_OUTBOX = "worker.tasks.sweep_outbox"
DATA_MAINTENANCE = "worker.tasks.data_maintenance"
AUDIT_CHECKPOINT = "worker.tasks.audit_checkpoint"
SIEM_EXPORT = "worker.tasks.siem_export"


def make_celery(settings: Settings) -> Celery:
    """The Celery app of ``settings``; ``ConfigError`` when its broker cannot be one (a Redis
    Cluster: app/redis_client.py). ``redis+sentinel://`` becomes kombu's ``sentinel://``."""
    redis_client.check_settings(settings)
    broker_url, sentinel_options = redis_client.celery_broker(
        settings.celery_broker_url or settings.redis_url, settings.redis_url)
    broker.install()  # redis:// keeps one Redis client per channel (see app/broker/transport.py)
    app = Celery("wecom_bot", include=["worker.tasks"])
    app.conf.update(
        broker_url=broker_url,
        # Celery prefers the CELERY_BROKER_URL environment variable to broker_url, which would
        # undo the redis+sentinel:// translation; its connections read these two instead.
        broker_read_url=broker_url,
        broker_write_url=broker_url,
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
            **sentinel_options,  # master_name (and the Sentinels' own password) for sentinel://
        },
        beat_schedule={
            "sweep-outbox": {"task": SWEEP_OUTBOX, "schedule": settings.sweep_interval_s},
            "data-maintenance": {"task": DATA_MAINTENANCE, "schedule": 3600.0},
            # A sealed checkpoint event: 'audit verify' then reports a head older than twice
            # this (a tail cut off and an old head put back). 0 turns both off.
            **({"audit-checkpoint": {"task": AUDIT_CHECKPOINT,
                                     "schedule": settings.audit_checkpoint_minutes * 60.0}}
               if settings.audit_checkpoint_minutes else {}),
            # Audit events and spend past each SIEM sink's cursor (app/siem); a run that
            # waited longer than the period in the queue is dropped, the next one takes over.
            **({"siem-export": {"task": SIEM_EXPORT, "schedule": settings.siem_interval_s,
                                "options": {"expires": settings.siem_interval_s}}}
               if settings.siem_enabled else {}),
        },
    )
    if is_amqp(settings.celery_broker_url):
        app.conf.update(_rabbitmq_options())
    return app


def is_amqp(url: str | None) -> bool:
    return (url or "").startswith(("amqp://", "amqps://", "pyamqp://"))


def chat_queue(app: Celery):
    """The queue the chat tasks go to, as the broker declares it (RabbitMQ: a quorum queue)."""
    return next(q for q in app.conf.task_queues if q.name == app.conf.task_default_queue)


def _rabbitmq_options() -> dict:
    """RabbitMQ, the recommended production broker: the chat queue is a quorum queue (replicated
    across the cluster's nodes, durable), every publish waits for the broker's confirm, and the
    messages are persistent. Acknowledgement stays late (``task_acks_late``): a worker that dies
    leaves its task to the queue. Celery turns off global QoS for quorum queues by itself."""
    return {
        "task_queues": (Queue("chat", Exchange("chat", type="direct"), routing_key="chat",
                              queue_arguments={"x-queue-type": "quorum"}, durable=True),),
        "task_default_exchange": "chat",
        "task_default_routing_key": "chat",
        "task_default_delivery_mode": "persistent",
        "broker_transport_options": {"confirm_publish": True},
        "worker_detect_quorum_queues": True,
    }
