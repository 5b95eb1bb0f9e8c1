"""The conversation store: one script appends an exchange once (a retried task, or the script
retried through a Redis failover, adds nothing), entries from before the upgrade still read."""

from __future__ import annotations

import json
import os
import uuid

import pytest
import redis

from app.redis_client import slot
from app.security import FieldCipher
from tests.support.env import redis_url
from worker.conversation import ConversationStore

REDIS_URL = redis_url(12)


@pytest.fixture
def client():
    return redis.Redis.from_url(REDIS_URL)


@pytest.fixture
def store(client):
    return ConversationStore(client, FieldCipher({"k1": os.urandom(32)}), ttl_s=60, max_messages=4)


def test_an_exchange_is_appended_once_and_the_list_trimmed(store, client):
    user = uuid.uuid4().hex
    assert store.append_exchange(user, 1, "q1", "a1") is True
    assert store.append_exchange(user, 1, "q1", "a1") is False  # the same task again
    assert store.append_exchange(user, 2, "q2", "a2") is True
    assert store.append_exchange(user, 3, "q3", "a3") is True
    turns = store.history(user)
    assert [(t["role"], t["content"], t["ref"]) for t in turns] == [
        ("user", "q2", 2), ("assistant", "a2", 2), ("user", "q3", 3), ("assistant", "a3", 3)]
    key, ref_key = f"conv:{user}", f"{{conv:{user}}}:ref"
    assert slot(key) == slot(ref_key) and client.get(ref_key) == b"3"
    assert 0 < client.ttl(key) <= 60 and 0 < client.ttl(ref_key) <= 60
    store.reset(user)
    assert store.history(user) == [] and not client.exists(key, ref_key)


def test_entries_written_before_the_upgrade_are_read_and_continued(store, client):
    """The list kept its name and its entries' associated data: the old pipeline's entries read,
    and the first append after the upgrade follows them."""
    user = uuid.uuid4().hex
    key = f"conv:{user}"
    old = [store.cipher.encrypt(json.dumps({"role": role, "content": text, "ref": 7}, ensure_ascii=False),
                                "redis", "conversation", key) for role, text in (("user", "旧问"), ("assistant", "旧答"))]
    client.rpush(key, *old)
    client.expire(key, 60)
    assert [t["content"] for t in store.history(user)] == ["旧问", "旧答"]
    assert store.append_exchange(user, 8, "新问", "新答") is True
    assert [t["content"] for t in store.history(user)] == ["旧问", "旧答", "新问", "新答"]
    store.reset(user)
