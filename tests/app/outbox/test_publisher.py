"""The callbacks' task publishing (app/outbox/publisher.py): ``send_many`` pushes, in one round trip,
the very message that kombu's own path (``send``) writes for the same task, and Celery's
consumer reads it back as that task."""

from __future__ import annotations

import base64
import json
import re
import uuid

import pytest
import redis

from app.outbox.publisher import TaskPublisher
from tests.support.env import make_env, redis_url, settings_from
from worker.celery_app import HANDLE_MESSAGE, make_celery

REDIS_URL = redis_url(15)
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.fixture
def publisher():
    celery = make_celery(settings_from(make_env(REDIS_URL=REDIS_URL)))
    queue = f"test-publisher-{uuid.uuid4().hex[:8]}"
    yield TaskPublisher(celery, queue=queue)
    redis.Redis.from_url(REDIS_URL).delete(queue, f"_kombu.binding.{queue}")


def _entries(publisher) -> list[dict]:
    return [json.loads(raw) for raw in reversed(redis.Redis.from_url(REDIS_URL).lrange(publisher.queue, 0, -1))]


def _without_ids(entry: dict) -> dict:
    """The entry with what names one task (its ids and delivery tag) taken out, after checking
    that they are well-formed and agree."""
    entry = json.loads(json.dumps(entry))
    task_id = entry["headers"].pop("id")
    assert UUID.match(task_id)
    assert entry["headers"].pop("root_id") == task_id
    assert entry["properties"].pop("correlation_id") == task_id
    assert UUID.match(entry["properties"].pop("delivery_tag"))
    return entry


def test_send_many_writes_what_kombu_writes_for_the_same_task(publisher):
    kombu_id = publisher.send(HANDLE_MESSAGE, [41], headers={"request_id": "req-1"})
    [many_id, other_id] = publisher.send_many(HANDLE_MESSAGE, [([41], {"request_id": "req-1"}),
                                                               ([42], None)])
    kombu, many, other = _entries(publisher)
    assert (kombu["headers"]["id"], many["headers"]["id"], other["headers"]["id"]) == (kombu_id, many_id, other_id)
    assert _without_ids(many) == _without_ids(kombu)
    assert base64.b64decode(many["body"]) == base64.b64decode(kombu["body"])
    assert json.loads(base64.b64decode(other["body"]))[0] == [42]
    assert other["headers"]["argsrepr"] == "[42]" and "request_id" not in other["headers"]


def test_celerys_consumer_reads_the_batch_back_as_the_tasks(publisher):
    ids = publisher.send_many(HANDLE_MESSAGE, [([n], {"request_id": f"req-{n}"}) for n in range(3)])
    with publisher.celery.connection_for_read() as connection:
        queue = connection.SimpleQueue(publisher.queue)
        received = []
        for _ in ids:
            message = queue.get(timeout=5)
            received.append((message.headers["id"], message.headers["task"], message.decode()[0],
                             message.headers["request_id"]))
            message.ack()
        queue.close()
    assert received == [(task_id, HANDLE_MESSAGE, [n], f"req-{n}") for n, task_id in enumerate(ids)]


def test_nothing_to_send_sends_nothing(publisher):
    assert publisher.send_many(HANDLE_MESSAGE, []) == []
    assert _entries(publisher) == []
