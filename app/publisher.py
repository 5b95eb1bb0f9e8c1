"""Publishing the worker's task from the web process, lean.

The message is Celery's own (protocol 2, ``app.amqp.create_task_message``), published on a
producer from Celery's pool straight to the queue, as ``send_task`` ends up doing for a direct
exchange. ``send_task`` also resolves routes, fires publish signals and sent-events and wraps
the publish twice, none of which the callback uses: on this machine it cost about 240 µs of a
callback's ~2 ms, and this about 100 µs. Retries follow ``task_publish_retry(_policy)``.
``send_many`` publishes many tasks in one Redis pipeline (kombu's ``Producer.batch``).
"""

from __future__ import annotations

from celery import Celery
from kombu.utils.uuid import uuid


class TaskPublisher:
    def __init__(self, celery: Celery, queue: str | None = None):
        conf = celery.conf
        self.celery = celery
        self.queue = queue or conf.task_default_queue
        self.retry = bool(conf.task_publish_retry)
        self.retry_policy = dict(conf.task_publish_retry_policy or {})

    def send(self, name: str, args: list, headers: dict | None = None) -> str:
        """Publish task ``name`` with positional ``args``; returns the task id. Raises what
        the broker raises once the retries are spent."""
        with self.celery.producer_or_acquire() as producer:
            return self._publish(producer, name, args, headers, retry=self.retry)

    def send_many(self, name: str, tasks: list[tuple[list, dict | None]]) -> list[str]:
        """Publish task ``name`` once per ``(args, headers)``, all in one round trip (no retry:
        on a failure none or some were sent, and the caller leaves them to the sweeper)."""
        with self.celery.producer_or_acquire() as producer, producer.batch():
            return [self._publish(producer, name, args, headers, retry=False) for args, headers in tasks]

    def _publish(self, producer, name: str, args: list, headers: dict | None, retry: bool) -> str:
        task_id = uuid()
        # ignore_result=None, as send_task leaves it: the worker's task decides (no result backend).
        task_headers, properties, body, _ = self.celery.amqp.create_task_message(
            task_id, name, args, {}, ignore_result=None)
        if headers:
            task_headers.update(headers)
        producer.publish(body, exchange="", routing_key=self.queue, serializer="json",
                         headers=task_headers, retry=retry, retry_policy=self.retry_policy, **properties)
        return task_id
