"""The AI bot's long connection end to end: the emulator (WeCom's WebSocket end) <- replicas of
``python -m app.web.aibot_connection`` -> intake -> outbox -> Celery -> the model's stream -> Redis ->
stream frames back over the connection; real Redis (DB 5), SQLite.

The fault test SIGKILLs the replica holding the connection mid-traffic: the other takes the lease,
subscribes, finishes what the dead one owed and answers the rest; no message is lost or answered
twice, and the two never held the connection at once (the emulator would have had to replace one
subscription by another: ``replaced`` stays 0).

Voice (WeCom's transcript), images (to a test vision server), files and mixed messages come over
the connection as over the callback (tests/worker/media/test_media_path.py), each image and file
with its own aeskey, and are answered once over it.
"""

import time

import pytest
import redis

from app.web.aibot_connection import LEASE_KEY, PENDING_KEY
from scripts.dev_env import random_aes_key
from tests.support.env import redis_url
from tests.support.media_servers import FakeVisionServer
from tests.support.stack import Stack, select_rows, wait_for

pytestmark = pytest.mark.integration
BOT = "小星"
SECRET = "aibot-long-connection-secret-for-tests"


@pytest.fixture(scope="module")
def vision():
    server = FakeVisionServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory, vision):
    s = Stack(tmp_path_factory.mktemp(f"aibot-ws-{request.param}"), db_kind=request.param, redis_db=5,
              model_stream_piece_delay_s=0.3,
              extra_env={"AIBOT_BOT_ID": "aib-emulator", "AIBOT_SECRET": SECRET, "AIBOT_NAME": BOT,
                         "AIBOT_TOKEN": "aibot-callback-token-for-tests",
                         "AIBOT_ENCODING_AES_KEY": random_aes_key(),
                         "AIBOT_REFRESH_THROTTLE_S": "0", "AIBOT_WS_LEASE_S": "2",
                         "AIBOT_WS_HEARTBEAT_S": "1", "VISION_MODEL": "test-vision",
                         "VISION_BASE_URL": vision.url, "VISION_TIMEOUT_S": "5",
                         "MEDIA_MAX_BYTES": str(256 * 1024),
                         "FEEDBACK_CARDS": "true"}).start()  # the AI bot's 👍/👎 (feedback.id)
    yield s
    s.stop()


def ws_status(stack) -> dict:
    return stack.emu("GET", "aibot/ws")


def send(stack, **body) -> dict:
    return stack.emu("POST", "aibot/send", json={"mode": "ws", **body})


def conversation(stack, delivery_id: int) -> dict:
    return stack.emu("GET", "aibot/conversations", params={"delivery_id": delivery_id})["conversations"][0]


def finished(stack, delivery_id: int, timeout: float = 60) -> dict:
    return wait_for(lambda: (c := conversation(stack, delivery_id))["status"] == "finished" and c,
                    timeout, 0.2, f"delivery {delivery_id} to finish")


def shown(stack, user: str) -> list[dict]:
    return [m for m in stack.emu("GET", "messages", params={"touser": user})["messages"]
            if m.get("source") == "aibot_ws"]


def holder_pid(stack) -> int | None:
    token = stack.redis.get(LEASE_KEY)
    return int(token.decode().split(":")[1]) if token else None


@pytest.fixture(scope="module")
def connected(stack):
    stack.start_connection("aibot-ws-a")
    wait_for(lambda: ws_status(stack)["connected"], 30, 0.2, "the long connection to subscribe")
    return stack


def test_a_message_over_the_connection_is_answered_over_it_once(connected):
    stack = connected
    question = "年假有几天？"
    done = finished(stack, send(stack, from_user="zhangwei", content=question)["delivery_id"])
    expected = f"答复#1: {question}"
    assert done["final"] == expected
    frames = done["refreshes"]
    assert frames[-1]["finish"] and all(not f["finish"] for f in frames[:-1])
    assert len({f["content"] for f in frames}) > 2, frames  # it streamed, frame by frame
    assert all(f["stream_id"] == done["stream_id"] for f in frames)
    assert done["pushes"] == 1 and done["duplicate_finish"] == 0
    assert [m["content"] for m in shown(stack, "zhangwei")] == [expected]
    rows = select_rows(stack.db.url, "SELECT status, stream_id FROM inbound_messages WHERE channel = 'aibot'")
    assert rows == [{"status": "answered", "stream_id": done["stream_id"]}]
    assert stack.redis.hlen(PENDING_KEY) == 0  # WeCom acknowledged the finish: nothing owed
    assert b"aibot_respond" not in stack.logs["aibot-ws-a"].read_bytes()  # frames by cmd only
    assert SECRET not in stack.log("aibot-ws-a") and question not in stack.log("aibot-ws-a")


def test_voice_images_files_and_mixed_over_the_connection_are_answered_once_over_it(connected, vision):
    stack = connected
    user = "zhouting"
    turns = [({"msg_type": "voice", "content": "报销流程是什么"}, lambda f: f.endswith("报销流程是什么")),
             ({"msg_type": "image"}, lambda f: f.startswith("看到1张图片(32x24 PNG)")),
             ({"msg_type": "mixed", "content": "这两张图有什么不同", "media_ids": ["emulator-image"] * 2},
              lambda f: f == "看到2张图片(32x24 PNG, 32x24 PNG): 这两张图有什么不同"),
             ({"msg_type": "file"}, lambda f: "/forget" in f)]
    ends = []
    for spec, expected in turns:
        done = finished(stack, send(stack, from_user=user, **spec)["delivery_id"], 90)
        assert expected(done["final"]), (spec, done)
        frames = done["refreshes"]
        assert frames[-1]["finish"] and all(not f["finish"] for f in frames[:-1]), frames
        assert done["pushes"] == 1 and done["duplicate_finish"] == 0
        ends.append(done)
    assert vision.problems == []
    assert [m["content"] for m in shown(stack, user)] == [e["final"] for e in ends]  # each once
    streams = [e["stream_id"] for e in ends]
    rows = select_rows(stack.db.url, "SELECT msg_type, status, stream_id FROM inbound_messages "
                                     "WHERE channel = 'aibot' AND msg_type <> 'text' ORDER BY id")
    assert [(r["msg_type"], r["status"], r["stream_id"]) for r in rows] == [
        (spec["msg_type"], "answered", s) for (spec, _), s in zip(turns, streams, strict=True)]
    assert stack.redis.hlen(PENDING_KEY) == 0


def test_groups_need_the_mention_and_enter_chat_gets_the_welcome(connected):
    stack = connected
    quiet = send(stack, from_user="lina", content="大家好", chat_type="group", mention=False)
    asked = finished(stack, send(stack, from_user="lina", content="报销流程？", chat_type="group")["delivery_id"])
    assert asked["final"].endswith("报销流程？")
    assert conversation(stack, quiet["delivery_id"])["status"] == "pushed"  # never answered
    stack.emu("POST", "aibot/enter_chat", json={"from_user": "wujun"})
    welcome = wait_for(lambda: [m for m in stack.emu("GET", "messages", params={"touser": "wujun"})["messages"]
                                if m.get("source") == "aibot_ws_welcome"], 15, 0.2, "the welcome")
    assert "AI" in welcome[0]["content"]


def test_an_answer_over_the_connection_is_rated_with_wecoms_thumbs(connected):
    """The question's first frame carries feedback.id; the emulator's 👍 comes back as an
    aibot_event_callback frame and the worker stores it for that answer, once; a group member
    who did not ask cannot rate it."""
    stack = connected
    done = finished(stack, send(stack, from_user="wujun", content="加班怎么申请？")["delivery_id"])
    assert done["feedback_id"] and done["refreshes"][0]["connection"] >= 1, done
    answer_id = select_rows(stack.db.url, "SELECT id FROM inbound_messages WHERE channel = 'aibot' "
                                          "AND msg_type = 'text' ORDER BY id")[-1]["id"]
    assert done["feedback_id"].startswith(f"fb-{answer_id}-")
    for body in ({"type": 1, "msg_id": f"ws-fb-{answer_id}"}, {"type": 1, "msg_id": f"ws-fb-{answer_id}"},
                 {"type": 2, "from_user": "lina"}):
        assert stack.emu("POST", "aibot/feedback", json={"delivery_id": done["delivery_id"], **body})["status"] == "sent"
    rated = f"SELECT rating, channel FROM answer_ratings WHERE message_id = {int(answer_id)}"
    wait_for(lambda: select_rows(stack.db.url, rated), 30, 0.2, "the rating to be stored")
    handled = ("SELECT status FROM inbound_messages WHERE event = 'feedback_event' AND status <> 'ignored'")
    wait_for(lambda: not select_rows(stack.db.url, handled), 30, 0.2, "every feedback event handled")
    assert select_rows(stack.db.url, rated) == [{"rating": 1, "channel": "aibot"}]
    assert ws_status(stack)["stats"]["event"] == 3
    assert "feedback_event not" not in stack.log("aibot-ws-a")


def test_one_msgid_by_the_connection_and_by_the_callback_is_one_row_answered_once(connected):
    stack = connected
    rows_before = len(select_rows(stack.db.url, "SELECT id FROM inbound_messages WHERE channel = 'aibot'"))
    by_ws = finished(stack, send(stack, from_user="sunhao", content="差旅标准？", msg_id="one-msgid-2ways")["delivery_id"])
    by_callback = stack.emu("POST", "aibot/send", json={"from_user": "sunhao", "content": "差旅标准？",
                                                       "msg_id": "one-msgid-2ways", "wait": 30})["conversation"]
    assert by_callback["status"] == "finished" and by_callback["stream_id"] == by_ws["stream_id"]
    assert by_callback["final"] == by_ws["final"]  # the callback's retry path: the same stream
    rows = select_rows(stack.db.url, "SELECT id FROM inbound_messages WHERE channel = 'aibot'")
    assert len(rows) == rows_before + 1  # the callback's copy of the msgid made no second row
    # By the stream id, not the last row: PostgreSQL returns unordered rows in heap order, which
    # updates (an earlier test's feedback events) reshuffle.
    ours = select_rows(stack.db.url, "SELECT status FROM inbound_messages WHERE stream_id = "
                                     f"'{by_ws['stream_id']}'")
    assert ours == [{"status": "answered"}]
    assert [m["content"] for m in shown(stack, "sunhao")] == [by_ws["final"]]  # pushed once


def test_an_owed_stream_whose_row_was_never_written_is_dropped_unanswered(connected):
    """What a holder killed between owing a stream and writing its row leaves behind: the next
    holder sends nothing for it (WeCom pushes the message again, see the emulator)."""
    stack = connected
    refused = ws_status(stack)["stats"].get("unknown_req_id", 0)
    stack.redis.hset(PENDING_KEY, "never-written-stream", '{"req_id": "aibot_msg_callback_0_dead", "msgid": "x"}')
    wait_for(lambda: not stack.redis.hexists(PENDING_KEY, "never-written-stream"), 10, 0.1, "the entry dropped")
    assert ws_status(stack)["stats"].get("unknown_req_id", 0) == refused  # no frame was sent for it


def test_the_holder_killed_mid_traffic_is_replaced_and_nothing_is_lost_or_doubled(connected):
    stack = connected
    stack.start_connection("aibot-ws-b")  # a second replica: waits for the lease
    time.sleep(3)
    assert ws_status(stack)["stats"].get("subscribed") == 1  # b never subscribed beside a
    first = holder_pid(stack)
    assert first == stack.procs["aibot-ws-a"].pid
    questions = "SELECT status FROM inbound_messages WHERE channel = 'aibot' AND msg_type <> 'event'"
    rows_before = len(select_rows(stack.db.url, questions))  # events (a 👍/👎 earlier) are no answers
    users = ["zhangwei", "lina", "wujun", "zhouting", "sunhao"]
    sent = [send(stack, from_user=users[i % len(users)], content=f"问题{i}：加班怎么算？")
            for i in range(8)]
    wait_for(lambda: any(conversation(stack, s["delivery_id"])["status"] == "streaming" for s in sent),
             20, 0.05, "a stream under way")
    stack.kill("aibot-ws-a")  # SIGKILL: no goodbye, the lease just stops being renewed
    sent += [send(stack, from_user=users[i % len(users)], content=f"问题{i}：加班怎么算？")
             for i in range(8, 12)]
    wait_for(lambda: holder_pid(stack) == stack.procs["aibot-ws-b"].pid, 15, 0.1, "b to take the lease")
    ends = [finished(stack, s["delivery_id"], 90) for s in sent]
    for i, end in enumerate(ends):
        assert end["final"].startswith("答复#") and end["final"].endswith(f": 问题{i}：加班怎么算？"), ends
    msgids = [s["msg_id"] for s in sent]
    handed_over = [e for e in ends if len({f["connection"] for f in e["refreshes"]}) > 1]
    assert handed_over, "no stream was begun by the killed holder and finished by the other"
    finals = [m for u in users for m in shown(stack, u) if m["delivery_id"] in {s["delivery_id"] for s in sent}]
    assert len(finals) == len(sent)  # one answer each, none twice
    rows = select_rows(stack.db.url, questions)
    assert len(rows) == rows_before + len(msgids) and all(r["status"] == "answered" for r in rows)
    stats = ws_status(stack)["stats"]
    assert stats.get("replaced", 0) == 0  # never two subscriptions at once
    assert stats.get("subscribed") == 2
    wait_for(lambda: stack.redis.hlen(PENDING_KEY) == 0, 10, 0.2, "nothing owed")


def test_two_replicas_never_both_hold_the_lease(stack):
    client = redis.Redis.from_url(stack.redis_url)
    seen = set()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        token = client.get(LEASE_KEY)
        if token:
            seen.add(token)
        time.sleep(0.05)
    assert len(seen) == 1  # the survivor keeps it; no one else renews in between


def test_a_dropped_connection_is_dialled_again_by_the_same_holder(stack):
    holder = holder_pid(stack)
    before = ws_status(stack)["stats"].get("subscribed", 0)
    assert stack.emu("POST", "aibot/ws/faults", json={"drop": True})["dropped"]
    wait_for(lambda: ws_status(stack)["stats"].get("subscribed", 0) == before + 1, 15, 0.1, "a new subscription")
    assert holder_pid(stack) == holder  # same replica: it kept the lease while reconnecting
    done = finished(stack, send(stack, from_user="zhangwei", content="断线之后还在吗？")["delivery_id"])
    assert done["final"].endswith("断线之后还在吗？")


def test_unanswered_pings_end_the_connection_and_it_reconnects(stack):
    before = ws_status(stack)["stats"].get("subscribed", 0)
    stack.emu("POST", "aibot/ws/faults", json={"answer_pings": False})
    try:  # heartbeat 1 s: dead after two unanswered pings, then a backoff of a second or so
        wait_for(lambda: ws_status(stack)["stats"].get("subscribed", 0) > before, 20, 0.2, "a reconnect")
    finally:
        stack.emu("POST", "aibot/ws/faults", json={"answer_pings": True})
    holder = next(name for name, proc in stack.procs.items() if proc.pid == holder_pid(stack))
    assert "heartbeat: pings unanswered" in stack.log(holder)


def test_a_wrong_secret_is_refused_and_retried_with_backoff(stack):
    # a replica with its own Redis DB (its own lease) and the wrong secret
    stack.env_backup = dict(stack.env)
    stack.env.update({"AIBOT_SECRET": "not-the-bots-secret-at-all-0123", "REDIS_URL": redis_url(6),
                      "CELERY_BROKER_URL": redis_url(6)})
    redis.Redis.from_url(redis_url(6)).flushdb()
    try:
        stack.start_connection("aibot-ws-wrong")
    finally:
        stack.env.clear()
        stack.env.update(stack.env_backup)
    time.sleep(6)
    refused = ws_status(stack)["stats"].get("subscribe_refused", 0)
    stack.kill("aibot-ws-wrong")
    redis.Redis.from_url(redis_url(6)).flushdb()
    assert 2 <= refused <= 6, refused  # 1 s doubling with jitter: a few tries, not a tight loop
    log = stack.log("aibot-ws-wrong")
    assert "subscription refused errcode=40001" in log and "not-the-bots-secret" not in log
    assert ws_status(stack)["connected"]  # the right holder was never displaced
    assert ws_status(stack)["stats"].get("replaced", 0) == 0
