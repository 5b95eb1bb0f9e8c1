"""Redis Sentinel (REDIS_URL=redis+sentinel://...): the state and Celery's broker (kombu's
``sentinel://`` transport, made from the same URL form) on a primary that three Sentinels watch.
The primary is killed mid-traffic and a replica promoted: every accepted message answered
exactly once, every conversation intact, the worker reconnected in-process.

The servers are this module's own (a primary, a replica, three Sentinels:
tests/support/redis_sentinel.py).
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.faults import answered_once, wait_answered
from tests.support.redis_sentinel import LocalRedisSentinel
from tests.support.stack import Stack, wait_for

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def sentinel():
    s = LocalRedisSentinel().start()
    yield s
    s.close()


@pytest.fixture(scope="module")
def stack(sentinel, tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("stack-redis-sentinel"), db_kind="sqlite", redis_url=sentinel.url(0),
              extra_env={"CELERY_BROKER_URL": sentinel.url(1)}).start()
    yield s
    s.stop()


def test_the_sentinel_primary_killed_mid_traffic(stack, sentinel):
    users = [u["userid"] for u in stack.emu("GET", "directory")["users"]][:5]
    expected = {user: [f"哨兵 {user} {i}" for i in range(5)] for user in users}
    for user in users:
        stack.send(user, expected[user][0], wait=True)
    wait_answered(stack, {u: expected[u][:1] for u in users}, timeout=60)
    worker_pid = stack.procs["worker"].pid
    old = sentinel.primary()

    def arrive():
        for i in range(1, 5):
            for user in users:
                stack.send(user, expected[user][i], wait=True)
            time.sleep(0.5)

    sender = threading.Thread(target=arrive)
    sender.start()
    time.sleep(1.0)
    sentinel.kill(old)
    failover_s = sentinel.wait_failover(old)
    sender.join(timeout=120)
    wait_answered(stack, expected, timeout=180)
    wait_for(lambda: all(r["status"] == "answered" for r in stack.outbox_rows()), timeout=120,
             what="every row answered")
    time.sleep(2)
    print(f"Sentinels promoted a replica {failover_s:.1f} s after the kill")
    assert len(stack.outbox_rows()) == 5 * len(users)  # each message accepted once
    assert answered_once(stack, expected) == {}
    for user in users:
        assert stack.replies(user) == [f"答复#{i + 1}: {t}" for i, t in enumerate(expected[user])], user
    assert stack.procs["worker"].pid == worker_pid and stack.procs["worker"].poll() is None
    assert "sentinel://" in stack.log("worker")  # Celery really ran on the Sentinel transport
