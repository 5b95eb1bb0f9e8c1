"""The 智能机器人 channel end to end: emulator (the AI bot) -> gunicorn -> outbox -> Celery -> the
model's stream -> Redis -> the bot's refresh callbacks, on real Redis (DB 4) and a real database.
"""

import json
import time

import pytest
import requests
from sqlalchemy import create_engine, text

from app.aibot.streams import EXPIRED_NOTICE, TRUNCATED_NOTICE, StreamStore
from app.config import parse_keyring
from app.security import FieldCipher
from app.wecom import aibot
from app.wecom.crypto import WeComCrypto
from scripts.dev_env import random_aes_key
from tests.support.openai_server import THINKING
from tests.support.stack import Stack, select_rows, wait_for
from worker.processor import FAILURE_NOTICE

pytestmark = pytest.mark.integration
BOT = "小星"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp(f"aibot-{request.param}"), db_kind=request.param, redis_db=4,
              model_stream_piece_delay_s=0.2,
              extra_env={"AIBOT_TOKEN": "aibot-token-for-tests", "AIBOT_ENCODING_AES_KEY": random_aes_key(),
                         "AIBOT_NAME": BOT, "AIBOT_REFRESH_THROTTLE_S": "0",
                         "FEEDBACK_CARDS": "true"},  # the AI bot's 👍/👎 (feedback.id)
              emulator_options={"aibot_poll_interval": 0.1}).start()
    yield s
    s.stop()


def send(stack, **body) -> dict:
    return stack.emu("POST", "aibot/send", json=body)


def conversation(stack, delivery_id: int) -> dict:
    found = stack.emu("GET", "aibot/conversations", params={"delivery_id": delivery_id})["conversations"]
    return found[0]


def finished(stack, delivery_id: int, timeout: float = 60) -> dict:
    return wait_for(lambda: (c := conversation(stack, delivery_id))["status"] != "streaming"
                    and c["status"] != "pending" and c, timeout, 0.2, "the stream to finish")


def aibot_rows(stack) -> list[dict]:
    return select_rows(stack.db.url,
                "SELECT id, status, stream_id, failure_reason, completion_tokens FROM inbound_messages "
                "WHERE channel = 'aibot' ORDER BY id")


def usage_count(stack, message_id: int) -> int:
    engine = create_engine(stack.db.url)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM usage_records WHERE message_id = :m"),
                                {"m": message_id}).scalar()
    finally:
        engine.dispose()


def test_url_verification_with_receive_id_empty(stack):
    assert stack.emu("POST", "aibot/verify")["ok"] is True


def test_an_answer_streams_through_refreshes_then_finishes(stack):
    question = "请介绍一下星河科技的年假制度和请假流程"
    sent = send(stack, from_user="zhangwei", content=question)
    done = finished(stack, sent["delivery_id"])
    assert done["status"] == "finished", (done["error"], done["refreshes"])
    expected = f"答复#1: {question}"
    assert done["final"] == expected
    contents = [r["content"] for r in done["refreshes"]]
    assert done["refreshes"][0]["kind"] == "message" and done["refreshes"][0]["finish"] is False
    partial = [c for c in dict.fromkeys(contents) if c and c != expected]
    assert len(partial) >= 2, contents  # the text grew while WeCom polled
    assert all(expected.startswith(p) for p in partial)
    assert [len(p) for p in partial] == sorted(len(p) for p in partial)
    assert done["refreshes"][-1]["finish"] is True
    assert all(r["stream_id"] == done["stream_id"] for r in done["refreshes"])
    rows = aibot_rows(stack)
    assert rows[-1]["status"] == "answered" and rows[-1]["stream_id"] == done["stream_id"]
    assert rows[-1]["completion_tokens"] == len(expected)  # usage recorded from the model's stream
    shown = stack.emu("GET", "messages", params={"touser": "zhangwei"})["messages"]
    assert [m["content"] for m in shown if m["source"] == "aibot_stream"][-1] == expected


def test_a_reasoning_models_thinking_never_shows_in_the_stream(stack):
    """The model thinks first, inline in its content (a server without a reasoning parser) or
    apart as reasoning_content: what WeCom polls holds the answer only, from the first refresh
    to the last; a reply that was all thinking ends with the failure notice."""
    for mode, user in (("inline", "zhouting"), ("separate", "wujun")):
        question = f"年假怎么休 #reasoning={mode}"
        done = finished(stack, send(stack, from_user=user, content=question)["delivery_id"])
        assert done["status"] == "finished", (done["error"], done["refreshes"])
        assert done["final"].startswith("答复#") and done["final"].endswith(question)
        shown = [r["content"] for r in done["refreshes"]]
        assert len(set(shown)) > 2, shown  # it streamed
        assert not any(THINKING[:8] in c or "think>" in c for c in shown), shown
    cut = finished(stack, send(stack, from_user="sunhao", content="长问题 #reasoning=cutoff")["delivery_id"])
    assert cut["final"] == FAILURE_NOTICE
    assert not any(THINKING[:8] in r["content"] for r in cut["refreshes"])
    assert aibot_rows(stack)[-1]["status"] == "failed"


def test_a_duplicate_msgid_is_answered_once(stack):
    before = len(aibot_rows(stack))
    first = send(stack, from_user="lina", content="报销需要哪些材料", msg_id="dup-msgid-1")
    second = send(stack, from_user="lina", content="报销需要哪些材料", msg_id="dup-msgid-1")
    a, b = finished(stack, first["delivery_id"]), finished(stack, second["delivery_id"])
    assert a["stream_id"] == b["stream_id"]
    assert a["final"] == b["final"] == "答复#1: 报销需要哪些材料"
    rows = aibot_rows(stack)
    assert len(rows) == before + 1 and rows[-1]["status"] == "answered"
    assert usage_count(stack, rows[-1]["id"]) == 1  # one model call, one usage row


def aibot_ratings(stack) -> list[dict]:
    return select_rows(stack.db.url, "SELECT message_id, rating, reasons FROM answer_ratings "
                                     "WHERE channel = 'aibot' ORDER BY id")


def rate(stack, delivery_id: int, **body) -> requests.Response:
    return requests.post(f"{stack.emulator.url}/_emulator/aibot/feedback",
                         json={"delivery_id": delivery_id, **body}, timeout=10)


def test_an_employee_rates_an_answer_with_wecoms_thumbs_and_withdraws_it(stack):
    """The first stream reply carries feedback.id; the emulator's 👎 (with reasons and text, sent
    twice with one msgid), then a withdrawal, reach the worker through the callback and the
    outbox: one rating of that answer, its reasons, then 0; a colleague's 👍 stores nothing."""
    done = finished(stack, send(stack, from_user="zhouting", content="出差补贴标准是什么")["delivery_id"])
    assert done["status"] == "finished" and done["feedback_id"], done
    [first, *later] = done["refreshes"]
    assert first["kind"] == "message" and later  # the id came with the first reply, as WeCom reads it
    answer_id = aibot_rows(stack)[-1]["id"]
    assert done["feedback_id"].startswith(f"fb-{answer_id}-")
    before = [r for r in aibot_ratings(stack) if r["message_id"] != answer_id]

    for _ in range(2):  # WeCom's second delivery of the same event: one outbox row, one rating
        resp = rate(stack, done["delivery_id"], type=2, reasons=[2], content="少了住宿标准",
                    msg_id=f"fb-ev-{answer_id}")
        assert resp.status_code == 200 and resp.json()["status"] == "sent", resp.text
    assert rate(stack, done["delivery_id"], type=1, from_user="lina").status_code == 200  # not hers
    wait_for(lambda: [r for r in aibot_ratings(stack) if r["message_id"] == answer_id], 30, 0.2,
             "the rating to be stored")
    events = wait_for(lambda: (rows := select_rows(
        stack.db.url, "SELECT status FROM inbound_messages WHERE event = 'feedback_event'")) and all(
        e["status"] == "ignored" for e in rows) and rows, 30, 0.2, "the feedback events to be handled")
    assert len(events) == 2  # the duplicate was dropped by msgid; lina's is a row, recorded nowhere
    assert [r for r in aibot_ratings(stack) if r["message_id"] == answer_id] == [
        {"message_id": answer_id, "rating": -1, "reasons": "2"}]

    assert rate(stack, done["delivery_id"], type=3).status_code == 200
    wait_for(lambda: [r["rating"] for r in aibot_ratings(stack) if r["message_id"] == answer_id] == [0],
             30, 0.2, "the withdrawal")
    assert [r for r in aibot_ratings(stack) if r["message_id"] != answer_id] == before
    assert "少了住宿标准" not in stack.log("worker") and "少了住宿标准" not in stack.log("web")


def test_a_reply_without_a_feedback_id_cannot_be_rated(stack):
    done = finished(stack, send(stack, from_user="zhouting", content="/help")["delivery_id"])
    assert done["status"] == "finished" and not done.get("feedback_id")
    assert rate(stack, done["delivery_id"], type=1).status_code == 409


def test_group_message_answered_only_when_mentioned(stack):
    before = len(aibot_rows(stack))
    ignored = send(stack, from_user="wangfang", content="大家中午吃什么", chat_type="group",
                   chat_id="wr-team", mention=False)
    assert finished(stack, ignored["delivery_id"])["status"] == "no_reply"
    assert len(aibot_rows(stack)) == before
    asked = send(stack, from_user="wangfang", content="年假有几天", chat_type="group", chat_id="wr-team")
    done = finished(stack, asked["delivery_id"])
    # The mention is stripped, and the group has its own history: this is its first turn.
    assert done["final"] == "答复#1: 年假有几天"
    assert len(aibot_rows(stack)) == before + 1


def poster(stack):
    crypto = WeComCrypto(stack.env["AIBOT_TOKEN"], stack.env["AIBOT_ENCODING_AES_KEY"], "")
    url = f"http://127.0.0.1:{stack.web_port}/wecom/aibot"

    def post(message: dict | None = None, *, body=None, signature=None):
        ts, nonce = str(int(time.time())), "nonce42"
        encrypt = crypto.encrypt(json.dumps(message or {}, ensure_ascii=False))
        params = {"msg_signature": signature or crypto.signature(ts, nonce, encrypt),
                  "timestamp": ts, "nonce": nonce}
        return requests.post(url, params=params, data=body if body is not None else json.dumps({"encrypt": encrypt}),
                             timeout=10)

    return crypto, post


def refresh_of(stream_id: str) -> dict:
    return {"msgid": f"r-{stream_id}", "msgtype": "stream", "stream": {"id": stream_id},
            "from": {"userid": "zhangwei"}, "chattype": "single"}


def test_a_stream_no_worker_finished_is_closed_by_the_callback_before_wecom_gives_up(stack):
    store = StreamStore(stack.redis, FieldCipher(parse_keyring(stack.env["DATA_KEYS"])), 900)
    crypto, post = poster(stack)
    long_ago = time.time() - 345  # past the 330 s deadline and the callback's grace
    store.open("stale-empty", 10**9, long_ago)
    store.write("stale-partial", 10**9 + 1, long_ago, "年假一共", finish=False)
    store.open("young", 10**9 + 2, time.time())
    reply = aibot.decrypt_reply(crypto, post(refresh_of("stale-empty")).content)
    assert reply == aibot.stream_message("stale-empty", EXPIRED_NOTICE, True)
    reply = aibot.decrypt_reply(crypto, post(refresh_of("stale-partial")).content)
    assert reply == aibot.stream_message("stale-partial", "年假一共" + TRUNCATED_NOTICE, True)
    assert store.get("stale-partial").finished  # a late worker cannot change it any more
    reply = aibot.decrypt_reply(crypto, post(refresh_of("young")).content)
    assert reply["stream"]["finish"] is False


def test_entering_the_chat_is_welcomed(stack):
    crypto, post = poster(stack)
    resp = post({"msgid": "e1", "msgtype": "event", "from": {"userid": "zhangwei"}, "chattype": "single",
                 "event": {"eventtype": "enter_chat"}})
    assert aibot.decrypt_reply(crypto, resp.content)["msgtype"] == "text"


def test_unknown_stream_gets_a_finished_empty_reply_and_bad_requests_are_4xx(stack):
    crypto, post = poster(stack)

    resp = post(refresh_of("no-such-stream"))
    assert resp.status_code == 200
    assert aibot.decrypt_reply(crypto, resp.content) == aibot.stream_message("no-such-stream", "", True)
    assert post(body="not json").status_code == 400
    assert post(body=json.dumps({"nothing": 1})).status_code == 400
    assert post({"msgtype": "text"}, signature="0" * 40).status_code == 403
    malformed = post({"msgtype": "text", "text": {"content": "hi"}})  # no msgid, no sender
    assert malformed.status_code == 400 and "msgid" in malformed.json()["error"]
