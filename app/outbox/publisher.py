"""Publishing the worker's task from the web process, lean: the one way both channels publish.

``publish_tasks`` is what every new outbox row goes through: the callbacks' group commit
(``app.intake.local``, ``app.web.intake_server``) and the AI bot's callback and long connection
(``app.web.aibot_callback.submit``, once the row's stream is open). A broker failure leaves the rows
queued for the sweeper (``worker.sweeper``).

``send`` publishes Celery's own message (protocol 2, ``app.amqp.create_task_message``) on a
producer from Celery's pool straight to the queue, as ``send_task`` ends up doing for a direct
exchange. ``send_task`` also resolves routes, fires publish signals and sent-events and wraps
the publish twice, none of which the callback uses: on this machine it cost about 240 µs of a
callback's ~2 ms, and this about 100 µs. Retries follow ``task_publish_retry(_policy)``.

``send_many`` is the callbacks' group commit publishing every new row's task at once (about
300 µs a task through kombu's ``Producer.batch``, most of it kombu's per-message envelope work,
against about 60 µs this way). It writes the very message ``send`` would: Celery's message for
the first task of a process is the template, each task changes only what names it (its id, the
repr of its arguments), kombu's Redis envelope (base64 body, delivery tag) is put around it,
and all are pushed with one ``LPUSH`` on the Redis connection of kombu's channel. The kombu
transport writes priority 0 to the queue's own key, which is what this publishes;
tests/app/outbox/test_publisher.py checks the two paths write the same message.
"""

from __future__ import annotations

import base64
import json
import logging
import os

import redis
from celery import Celery
from celery.utils.saferepr import saferepr
from kombu.utils.uuid import uuid

from app.broker.task_queue import HANDLE_MESSAGE, chat_queue, is_amqp

log = logging.getLogger(__name__)
_EMBED_JSON = json.dumps({"callbacks": None, "errbacks": None, "chain": None, "chord": None})


def publish_tasks(publisher: TaskPublisher, tasks: list[tuple[int, str | None]], client=None) -> None:
    """Publish ``handle_message`` for each ``(row id, request id)`` in one round trip (on
    ``client``, if given: see ``TaskPublisher.send_many``); the request id rides in the task's
    headers for the worker's logs. On a broker failure the rows stay queued and the sweeper
    enqueues them."""
    try:
        publisher.send_many(HANDLE_MESSAGE, [
            ([message_id], {"request_id": request_id} if request_id else None)
            for message_id, request_id in tasks], client)
    except Exception as exc:  # noqa: BLE001 - any broker failure leaves the rows to the sweeper
        log.warning("enqueue failed for %d message(s), left for the sweeper: %s",
                    len(tasks), type(exc).__name__)


class TaskPublisher:
    def __init__(self, celery: Celery, queue: str | None = None):
        conf = celery.conf
        self.celery = celery
        self.queue = queue or conf.task_default_queue
        # RabbitMQ: publish to the declared quorum queue through its exchange (declared on first
        # use, so a message sent before any worker started is not dropped as unroutable)
        self.amqp_queue = chat_queue(celery) if is_amqp(conf.broker_url) else None
        self.retry = bool(conf.task_publish_retry)
        self.retry_policy = dict(conf.task_publish_retry_policy or {})
        self._templates: dict[tuple[int, str], tuple[str, str]] = {}

    def send(self, name: str, args: list, headers: dict | None = None) -> str:
        """Publish task ``name`` with positional ``args``; returns the task id. Raises what
        the broker raises once the retries are spent."""
        task_id = uuid()
        # ignore_result=None, as send_task leaves it: the worker's task decides (no result backend).
        task_headers, properties, body, _ = self.celery.amqp.create_task_message(
            task_id, name, args, {}, ignore_result=None)
        if headers:
            task_headers.update(headers)
        with self.celery.producer_or_acquire() as producer:
            self._publish(producer, body, task_headers, properties)
        return task_id

    def _publish(self, producer, body, headers: dict, properties: dict) -> None:
        if self.amqp_queue is None:
            producer.publish(body, exchange="", routing_key=self.queue, serializer="json",
                             headers=headers, retry=self.retry, retry_policy=self.retry_policy, **properties)
            return
        queue = self.amqp_queue
        producer.publish(body, exchange=queue.exchange, routing_key=queue.routing_key, serializer="json",
                         headers=headers, retry=self.retry, retry_policy=self.retry_policy,
                         declare=[queue], **{"delivery_mode": 2, **properties})

    def send_many(self, name: str, tasks: list[tuple[list, dict | None]], client=None) -> list[str]:
        """Publish task ``name`` once per ``(args, headers)``, in one round trip; returns the
        task ids. No retry: on a failure none was sent, and the caller leaves them to the sweeper.
        ``client``: a Redis client of the broker's to push with (default: kombu's channel's,
        taken from Celery's producer pool for each call)."""
        if self.amqp_queue is not None:  # RabbitMQ: each confirmed, on one producer
            ids = []
            with self.celery.producer_or_acquire() as producer:
                for args, headers in tasks:
                    ids.append(uuid())
                    task_headers, properties, body, _ = self.celery.amqp.create_task_message(
                        ids[-1], name, args, {}, ignore_result=None)
                    task_headers.update(headers or {})
                    self._publish(producer, body, task_headers, properties)
            return ids
        ids, messages = [], []
        for args, headers in tasks:
            task_id = uuid()
            ids.append(task_id)
            messages.append(self._message(name, task_id, args, headers))
        if not messages:
            return ids
        if client is not None:
            client.lpush(self.queue, *messages)
            return ids
        with self.celery.producer_or_acquire() as producer, producer.channel.conn_or_acquire() as pooled:
            pooled.lpush(self.queue, *messages)
        return ids

    def broker_client(self):
        """A Redis client of the broker's own, for a thread that publishes often; None when the
        broker is not a plain Redis URL (then ``send_many`` goes through kombu)."""
        url = self.celery.conf.broker_url or ""
        if not url.startswith(("redis://", "rediss://")):  # amqp://, kombu's sentinel://
            return None
        options = self.celery.conf.broker_transport_options or {}
        return redis.Redis.from_url(url, socket_timeout=options.get("socket_timeout", 2),
                                    socket_connect_timeout=options.get("socket_connect_timeout", 1))

    def _message(self, name: str, task_id: str, args: list, headers: dict | None) -> str:
        """The Redis list entry kombu would write for this task, spliced into the process's
        template for ``name`` (a JSON object per task cost more than the rest of the publish)."""
        static_headers, static_properties = self._template(name)
        argsrepr = repr(args) if all(type(a) is int for a in args) else saferepr(args)
        body = base64.b64encode(f"[{json.dumps(args)}, {{}}, {_EMBED_JSON}]".encode()).decode()
        extra = "".join(f",{json.dumps(k)}:{json.dumps(v)}" for k, v in headers.items()) if headers else ""
        return (f'{{"body":"{body}","content-encoding":"utf-8","content-type":"application/json",'
                f'"headers":{{{static_headers}"id":"{task_id}","root_id":"{task_id}",'
                f'"argsrepr":{json.dumps(argsrepr)}{extra}}},'
                f'"properties":{{{static_properties}"correlation_id":"{task_id}","delivery_tag":"{uuid()}"}}}}')

    def _template(self, name: str) -> tuple[str, str]:
        """Celery's headers and kombu's properties for task ``name`` in this process (the
        headers name the process: ``origin``), as JSON members without what names a task."""
        key = (os.getpid(), name)
        template = self._templates.get(key)
        if template is None:
            headers, properties, _, _ = self.celery.amqp.create_task_message(
                "template", name, [], {}, ignore_result=None)
            properties = {**properties, "delivery_mode": 2,
                          "delivery_info": {"exchange": "", "routing_key": self.queue},
                          "priority": 0, "body_encoding": "base64"}
            template = self._templates[key] = (_members(headers, ("id", "root_id", "argsrepr")),
                                                _members(properties, ("correlation_id", "delivery_tag")))
        return template


def _members(values: dict, leave_out: tuple[str, ...]) -> str:
    """``values`` as the members of a JSON object, each followed by a comma."""
    return "".join(f"{json.dumps(k)}:{json.dumps(v)}," for k, v in values.items() if k not in leave_out)
