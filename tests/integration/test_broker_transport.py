"""worker/broker.py: Celery publishes through one Redis client per channel, and the tasks it
publishes are the ordinary Celery messages a worker consumes."""

from __future__ import annotations

import redis

from app.config import Settings
from tests.support.stack import make_env
from worker.broker import Channel
from worker.celery_app import HANDLE_MESSAGE, make_celery

REDIS_URL = "redis://127.0.0.1:6379/0"


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
