"""app/broker/transport.py: Celery publishes through one Redis client per channel, and the tasks it
publishes are the ordinary Celery messages a worker consumes."""

from __future__ import annotations

import pytest
import redis

from app.broker.transport import Channel
from app.config import Settings
from tests.support.env import redis_url
from tests.support.stack import make_env
from worker.celery_app import HANDLE_MESSAGE, make_celery

pytestmark = pytest.mark.integration

REDIS_URL = redis_url(10)  # not 0: a running make run stack keeps its queues there


def _celery():
    env = make_env(DATABASE_URL="sqlite://", REDIS_URL=REDIS_URL)
    return make_celery(Settings(**{k.lower(): v for k, v in env.items()}))


def test_publishes_share_one_client_and_survive_a_pool_reset():
    store = redis.Redis.from_url(REDIS_URL)
    store.flushdb()
    app = _celery()
    try:
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            assert isinstance(channel, Channel)
            producer = app.amqp.Producer(channel)
            for i in range(3):
                app.send_task(HANDLE_MESSAGE, args=[i], producer=producer)
            first = channel._shared_client
            assert first is not None and store.llen("chat") == 3
            channel._pool = None  # what kombu does after a disconnect: a new pool
            app.send_task(HANDLE_MESSAGE, args=[3], producer=producer)
            assert channel._shared_client is not first
            assert channel._shared_client.connection_pool is channel.pool
        with app.connection_for_read() as connection:
            queue = connection.SimpleQueue("chat", no_ack=True)
            received = [queue.get(timeout=5) for _ in range(4)]
            queue.close()
        assert sorted(m.headers["task"] for m in received) == [HANDLE_MESSAGE] * 4
        assert sorted(m.payload[0][0] for m in received) == [0, 1, 2, 3]
    finally:
        store.flushdb()


def test_the_lean_publisher_sends_what_send_task_sends():
    from app.outbox.publisher import TaskPublisher

    store = redis.Redis.from_url(REDIS_URL)
    store.flushdb()
    app = _celery()
    try:
        app.send_task(HANDLE_MESSAGE, args=[7], headers={"request_id": "r1"})
        task_id = TaskPublisher(app).send(HANDLE_MESSAGE, [7], headers={"request_id": "r1"})
        with app.connection_for_read() as connection:
            queue = connection.SimpleQueue("chat", no_ack=True)
            by_celery, lean = (queue.get(timeout=5) for _ in range(2))
            queue.close()
        assert lean.headers["id"] == task_id and lean.headers["task"] == HANDLE_MESSAGE
        assert lean.headers["request_id"] == "r1"
        assert lean.payload == by_celery.payload  # [[7], {}, {callbacks...}]
        skip = {"id", "root_id", "origin"}  # per message / per process
        assert {k: v for k, v in lean.headers.items() if k not in skip} == \
            {k: v for k, v in by_celery.headers.items() if k not in skip}
        assert lean.properties["delivery_info"]["routing_key"] == "chat"
        assert lean.content_type == by_celery.content_type == "application/json"
    finally:
        store.flushdb()
