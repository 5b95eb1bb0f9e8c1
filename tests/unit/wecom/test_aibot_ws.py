"""The long connection's frames, heartbeat, backoff and lease (app/wecom/aibot_ws.py,
app/aibot_connection.py's Lease on a real Redis, DB 13)."""

import json
import random

import pytest
import redis

from app.aibot_connection import Lease
from app.wecom import aibot_ws as ws


def test_frames_have_the_sdk_shape():
    sub = json.loads(ws.subscribe("bot-1", "s3cret").encode())
    assert sub["cmd"] == "aibot_subscribe" and sub["body"] == {"bot_id": "bot-1", "secret": "s3cret"}
    assert sub["headers"]["req_id"].startswith("aibot_subscribe_")
    ping = json.loads(ws.ping().encode())
    assert ping["cmd"] == "ping" and "body" not in ping and ping["headers"]["req_id"].startswith("ping_")
    reply = json.loads(ws.respond_stream("req-9", "s-1", "答：你好", True).encode())
    assert reply == {"cmd": "aibot_respond_msg", "headers": {"req_id": "req-9"},
                     "body": {"msgtype": "stream", "stream": {"id": "s-1", "finish": True, "content": "答：你好"}}}
    welcome = json.loads(ws.respond_welcome("req-e", "hi").encode())
    assert welcome["cmd"] == "aibot_respond_welcome_msg" and welcome["body"]["text"]["content"] == "hi"


def test_decode_round_trips_and_reads_acks():
    frame = ws.respond_stream("r", "s", "x", False)
    assert ws.decode(frame.encode()) == frame
    ack = ws.decode('{"headers": {"req_id": "ping_1_ab"}, "errcode": 0, "errmsg": "ok"}')
    assert ack.is_ack and ack.errcode == 0 and ack.cmd == ""
    callback = ws.decode(json.dumps({"cmd": "aibot_event_callback", "headers": {"req_id": "e"},
                                     "body": {"msgtype": "event", "event": {"eventtype": "enter_chat"}}}))
    assert not callback.is_ack and ws.event_type(callback) == "enter_chat"


@pytest.mark.parametrize("raw", [
    "not json", "[]", '{"cmd": "x"}', '{"cmd": "x", "headers": {"req_id": ""}}',
    '{"headers": {"req_id": "r"}}', '{"cmd": 3, "headers": {"req_id": "r"}}',
    '{"cmd": "x", "headers": {"req_id": "r"}, "body": []}',
    '{"headers": {"req_id": "r"}, "errcode": "0"}', '{"headers": {"req_id": "r"}, "errcode": true}',
    "x" * (ws.MAX_FRAME_BYTES + 1),
])
def test_decode_refuses_what_is_not_a_frame(raw):
    with pytest.raises(ws.FrameError):
        ws.decode(raw)


def test_heartbeat_is_due_every_interval_and_dead_after_two_misses():
    now = [0.0]
    hb = ws.Heartbeat(30, clock=lambda: now[0])
    assert not hb.due()
    now[0] = 30
    assert hb.due()
    hb.sent()
    assert not hb.due() and not hb.dead
    hb.acked()
    now[0] = 60
    hb.sent()
    now[0] = 90
    hb.sent()
    assert hb.dead  # two pings in a row unanswered
    hb.acked()
    assert not hb.dead


def test_backoff_grows_is_capped_jittered_and_resets():
    backoff = ws.Backoff(1.0, 30.0, rng=random.Random(7))
    delays = [backoff.next() for _ in range(12)]
    assert all(0.5 <= d <= 30.0 for d in delays)
    assert max(delays[:2]) <= 2.0 and backoff.ceiling() == 30.0
    assert len({round(d, 6) for d in delays}) == len(delays)  # jittered, not in step
    backoff.reset()
    assert backoff.ceiling() == 1.0 and backoff.next() <= 1.0


@pytest.fixture
def client():
    c = redis.Redis.from_url("redis://127.0.0.1:6379/13")
    try:
        c.ping()
    except redis.RedisError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    c.flushdb()
    yield c
    c.flushdb()


def test_one_lease_holder_at_a_time(client):
    a, b = Lease(client, 2.0), Lease(client, 2.0)
    assert a.acquire() and not b.acquire()
    assert a.renew() and a.fresh()
    assert not b.renew()  # only the holder may renew
    b.release()  # nor release
    assert client.get(a.key) == a.token.encode()
    a.release()
    assert b.acquire() and not a.renew()


def test_a_dead_holders_lease_expires(client):
    a, b = Lease(client, 1.0), Lease(client, 1.0)
    assert a.acquire()
    client.pexpire(a.key, 50)  # as if a's renewals stopped a second ago
    import time

    time.sleep(0.1)
    assert b.acquire() and not a.renew()
