"""State on a Redis Cluster (REDIS_URL=redis+cluster://...): every Redis use of the app and the
worker works on it, the stack answers every message once and in order, and again when the
primary holding conversations is killed mid-traffic (its replica takes the slots over; the app's
client waits the failover out): every accepted message answered exactly once, every
conversation intact.

The cluster is this module's own (six redis-server processes, tests/support/redis_cluster.py);
Celery runs on RabbitMQ in a vhost of the module's own (a cluster cannot be Celery's broker).
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from app import ratelimit, redis_client
from app.aibot.streams import StreamStore
from app.heartbeats import live_nodes
from app.security import FieldCipher
from app.web.aibot_connection import Lease, Pending
from tests.support.env import settings_from
from tests.support.faults import answered_once, wait_answered
from tests.support.rabbitmq import rabbitmq_vhost
from tests.support.redis_cluster import LocalRedisCluster
from tests.support.stack import Stack, wait_for
from worker.conversation import ConversationStore
from worker.media.files import FileContexts
from worker.observability.heartbeat import Heartbeat

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def cluster():
    c = LocalRedisCluster().start()
    yield c
    c.close()


def test_every_redis_use_works_on_the_cluster(cluster):
    """Each kind of call the app and worker make: scripts (one slot, keys declared), pipelines,
    locks, the heartbeats' sorted sets, a two-key script (conversation + its ref), a pipeline
    over two slots (the AI bot's pending and delivered)."""
    r = redis_client.from_url(cluster.url)
    cipher = FieldCipher({"k1": os.urandom(32)})
    now = time.time()
    window = [ratelimit.sliding_window(r, "wecom-user:u1", m, 2, 60, now).allowed for m in ("m1", "m2", "m3", "m1")]
    assert window == [True, True, False, True]
    assert [ratelimit.fixed_window(r, "api:1", 1, 60, now).allowed for _ in range(2)] == [True, False]
    ratelimit.window_add(r, "login:x", 60, now)
    assert ratelimit.window_count(r, "login:x", 60, now) == 1
    assert ratelimit.once_per_window(r, "notice:u1", 60) and not ratelimit.once_per_window(r, "notice:u1", 60)

    streams = StreamStore(r, cipher, 60)
    streams.open("s1", 5, now)
    assert streams.write("s1", 5, now, "半", finish=False) and streams.write("s1", 5, now, "全部", finish=True)
    assert not streams.write("s1", 5, now, "晚了", finish=True)
    assert streams.get("s1").text == "全部" and streams.get("s1").finished

    lease = Lease(r, 5)
    assert lease.acquire() and lease.renew() and not Lease(r, 5).acquire()
    lease.release()
    assert Lease(r, 5).acquire()
    pending = Pending(r)
    pending.add("s1", "req-1", "msg-1")
    pending.delivered("s1", 60)  # SET aibot:ws:delivered:s1 + HDEL aibot:ws:pending: two slots
    assert pending.was_delivered("s1") and pending.get("s1") is None and pending.all() == {}

    lock = r.lock("outbox:sweeper", timeout=5, blocking=False)
    assert lock.acquire() and not r.lock("outbox:sweeper", timeout=5, blocking=False).acquire()
    lock.release()
    beat = Heartbeat(r, "worker", "celery@n1", 3)
    beat.beat()
    assert live_nodes(r, "worker") == ["celery@n1"]

    conversations = ConversationStore(r, cipher, 60, 20)
    assert conversations.append_exchange("h1", 1, "问", "答") and not conversations.append_exchange("h1", 1, "问", "答")
    assert [t["content"] for t in conversations.history("h1")] == ["问", "答"]
    files = FileContexts(r, cipher, 60)
    files.add("h1", 1, "a.txt", "text")
    assert [f["name"] for f in files.files("h1")] == ["a.txt"] and files.drop("h1") == 1
    conversations.reset("h1")
    assert conversations.history("h1") == []
    # the keys are spread over the primaries; SCAN on each finds them all
    assert len({cluster.primary_of(k) for k in cluster.keys("*")}) >= 2
    r.flushdb()


def test_a_resharding_is_followed(cluster):
    """A conversation's slot moves to another primary while exchanges are appended and read:
    the client follows ASK (keys already moved; hundreds of them in a run), TRYAGAIN should the
    list and its ref be split for a moment, and MOVED (the slot's new owner); nothing fails,
    nothing is lost or doubled."""
    r = redis_client.from_url(cluster.url)
    store = ConversationStore(r, FieldCipher({"k1": os.urandom(32)}), 600, 10_000)
    user = "resharded"
    key = f"conv:{user}"
    for i in range(3000):  # keys of the same slot, so the move takes a while
        r.set(redis_client.companion_key(key, f":pad:{i}"), i)
    source = cluster.primary_of(key)
    target = next(p for p in cluster.primaries() if p != source)
    errors, appended, stop = [], [], threading.Event()

    def chat():
        ref = 0
        while not stop.is_set():
            ref += 1
            try:
                assert store.append_exchange(user, ref, f"q{ref}", f"a{ref}")
                appended.append(ref)
                assert store.history(user)[-1]["ref"] == ref
                r.set(f"other:{ref}", ref)  # and keys of other slots meanwhile
            except Exception as exc:  # noqa: BLE001 - collected, asserted below
                errors.append(repr(exc))

    talker = threading.Thread(target=chat)
    talker.start()
    time.sleep(0.3)
    moved = cluster.migrate_slot(redis_client.slot(key), target)
    time.sleep(0.3)
    stop.set()
    talker.join(timeout=30)
    assert errors == []
    assert moved > 3000 and cluster.primary_of(key) == target
    assert [t["ref"] for t in store.history(user)][::2] == appended and len(appended) > 10
    r.flushdb()


@pytest.fixture(scope="module")
def stack(cluster, tmp_path_factory):
    with rabbitmq_vhost() as broker:
        s = Stack(tmp_path_factory.mktemp("stack-redis-cluster"), db_kind="postgres", redis_url=cluster.url,
                  extra_env={"REDIS_URL": cluster.url, "CELERY_BROKER_URL": broker}).start()
        yield s
        s.stop()


def test_every_message_answered_once_in_order_on_the_cluster(stack, cluster):
    users = [u["userid"] for u in stack.emu("GET", "directory")["users"]][:4]
    expected = {user: [f"{user} 问题 {i}" for i in range(3)] for user in users}
    for i in range(3):
        for user in users:
            stack.send(user, expected[user][i], wait=True)
    wait_answered(stack, expected, timeout=120)
    time.sleep(2)  # anything duplicated would arrive now
    assert answered_once(stack, expected) == {}
    for user in users:  # the fake model counts the turns it saw: the history is in the cluster
        assert stack.replies(user) == [f"答复#{i + 1}: {t}" for i, t in enumerate(expected[user])]
    assert len(cluster.keys("conv:*")) == len(users)


def test_the_primary_of_a_conversation_killed_mid_traffic(stack, cluster):
    """The primary serving a conversation's slot is SIGKILLed while messages arrive; its replica
    takes over. Nothing lost, nothing doubled, and each conversation goes on where it was (the
    fake model's reply numbers the user turns it was given: a lost or doubled turn shows)."""
    services = settings_from(stack.env)
    from app.outbox.rows import user_hash
    from app.services import Services

    blind_index = Services(services).blind_index
    users = [u["userid"] for u in stack.emu("GET", "directory")["users"]][4:10]
    first = {user: f"开始 {user}" for user in users}
    for user in users:
        stack.send(user, first[user], wait=True)
    wait_answered(stack, {u: [first[u]] for u in users}, timeout=60)
    keys = {user: f"conv:{user_hash(blind_index, user)}" for user in users}
    victim = cluster.primary_of(keys[users[0]])
    on_victim = [user for user in users if cluster.primary_of(keys[user]) == victim]
    expected = {user: [first[user], *[f"主节点故障 {user} {i}" for i in range(4)]] for user in users}
    before = len(stack.outbox_rows())
    worker_pid = stack.procs["worker"].pid

    def arrive():
        for i in range(4):
            for user in users:
                stack.send(user, expected[user][i + 1], wait=True)
            time.sleep(0.5)

    sender = threading.Thread(target=arrive)
    sender.start()
    time.sleep(1.0)
    cluster.kill(victim)  # SIGKILL: no save, no handover
    failover_s = cluster.wait_failover(victim)
    sender.join(timeout=120)
    wait_answered(stack, expected, timeout=180)
    wait_for(lambda: all(r["status"] == "answered" for r in stack.outbox_rows()), timeout=120,
             what="every row answered")
    time.sleep(2)
    print(f"failover {failover_s:.1f} s after the kill; {len(on_victim)} of {len(users)} "
          f"conversations on the killed primary")
    assert len(stack.outbox_rows()) - before == 4 * len(users)  # each message accepted once
    assert answered_once(stack, expected) == {}
    for user in users:  # in order, each turn once: the conversation survived the failover
        assert stack.replies(user) == [f"答复#{i + 1}: {t}" for i, t in enumerate(expected[user])], user
    for user in on_victim:  # the promoted replica serves them, every exchange there once
        assert stack.redis.llen(keys[user]) == 2 * len(expected[user])
        assert cluster.primary_of(keys[user]) != victim
    assert stack.procs["worker"].pid == worker_pid and stack.procs["worker"].poll() is None
