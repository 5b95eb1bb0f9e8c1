"""End to end through the emulator: WeCom -> gunicorn -> outbox -> Celery -> model -> WeCom."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.support.openai_server import THINKING
from tests.support.stack import wait_for
from worker.processor import FAILURE_NOTICE

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def employees(stack):
    users = [u["userid"] for u in stack.emu("GET", "directory")["users"]]
    assert len(users) >= 10
    return users


def test_url_verification(stack):
    result = stack.emu("POST", "verify")
    assert result["ok"] is True and result["status_code"] == 200


def test_ten_employees_fifty_messages_each_answered_once_in_order(stack, employees):
    per_user = 5
    EMPLOYEES = employees[:10]
    start = {user: len(stack.replies(user)) for user in EMPLOYEES}

    def chat(user):
        for i in range(per_user):
            # wait: the emulator returns once WeCom's first delivery attempt was answered, as
            # a person types the next message after the previous one left the phone.
            stack.send(user, f"{user} 的第{i + 1}个问题", wait=True)

    with ThreadPoolExecutor(len(EMPLOYEES)) as pool:
        list(pool.map(chat, EMPLOYEES))

    def all_answered():
        return all(len(stack.replies(u)) - start[u] >= per_user for u in EMPLOYEES)

    wait_for(all_answered, timeout=120, interval=0.5, what="50 answers")
    time.sleep(2)  # anything duplicated would arrive now
    for user in EMPLOYEES:
        got = stack.replies(user)[start[user]:]
        # The fake model names how many user turns it saw: the conversation grows in order.
        assert got == [f"答复#{start[user] + i + 1}: {user} 的第{i + 1}个问题" for i in range(per_user)], got
    rows = stack.outbox_rows()
    assert all(r["status"] == "answered" for r in rows if r["msg_type"] == "text")


def test_a_reasoning_models_thinking_never_reaches_the_employee(stack, employees):
    """The model thinks first (inline in its content, or apart as reasoning_content): the
    employee gets the answer alone; a reply that was all thinking gets the failure notice."""
    user = employees[-2]
    start = len(stack.replies(user))
    questions = [f"加班怎么算 #reasoning={mode}" for mode in ("inline", "separate", "cutoff")]
    for question in questions:
        stack.send(user, question, wait=True)
    wait_for(lambda: len(stack.replies(user)) - start >= len(questions), timeout=60, interval=0.5,
             what="three answers")
    got = stack.replies(user)[start:]
    assert got[0].endswith(questions[0]) and got[1].endswith(questions[1]), got
    assert got[2] == FAILURE_NOTICE
    assert not any(THINKING[:8] in reply or "think>" in reply for reply in got), got


def test_forced_wecom_retry_gives_no_duplicate(stack, employees):
    before_rows = len(stack.outbox_rows())
    sent = stack.send(employees[-1], "请问年假有几天？", force_retry=True)
    wait_for(lambda: len(stack.emu("GET", "callbacks", params={"msg_id": sent["msg_id"]})["attempts"]) >= 2,
             timeout=20, what="the forced second delivery")
    wait_for(lambda: any("请问年假有几天？" in r for r in stack.replies(employees[-1])), timeout=30,
             what="the answer")
    time.sleep(2)
    assert sum("请问年假有几天？" in r for r in stack.replies(employees[-1])) == 1
    assert len(stack.outbox_rows()) == before_rows + 1


def test_enter_agent_welcomes_and_image_gets_a_text_only_notice(stack, employees):
    user = employees[-2]
    n = len(stack.replies(user))
    stack.send(user, event="enter_agent")
    wait_for(lambda: len(stack.replies(user)) == n + 1, timeout=30, what="welcome")
    assert "助手" in stack.replies(user)[-1]
    stack.send(user, msg_type="image", pic_url="http://example.invalid/a.png", media_id="MEDIA1")
    wait_for(lambda: len(stack.replies(user)) == n + 2, timeout=30, what="notice")
    assert "文字" in stack.replies(user)[-1]


def test_help_and_reset_commands(stack, employees):
    user = employees[-3]
    stack.send(user, "第一问")
    wait_for(lambda: any(r.endswith("第一问") for r in stack.replies(user)), timeout=30, what="answer")
    stack.send(user, "/reset")
    wait_for(lambda: "Conversation cleared" in stack.replies(user)[-1], timeout=30, what="reset")
    stack.send(user, "/help")
    wait_for(lambda: "/reset" in stack.replies(user)[-1], timeout=30, what="help")
    stack.send(user, "重新开始")
    wait_for(lambda: stack.replies(user)[-1].endswith("重新开始"), timeout=30, what="answer")
    assert stack.replies(user)[-1].startswith("答复#1:")  # history was cleared


def test_health(stack):
    assert requests.get(f"http://127.0.0.1:{stack.web_port}/healthz", timeout=5).json() == {"status": "ok"}


def test_concurrent_duplicates_from_many_threads_make_one_row(stack, employees):
    """The same callback body POSTed at once by 8 clients: one row, one answer."""
    from app.wecom.crypto import WeComCrypto

    crypto = WeComCrypto(stack.env["WECOM_TOKEN"], stack.env["WECOM_AES_KEY"], stack.env["WECOM_CORP_ID"])
    now = int(time.time())
    xml = (f"<xml><ToUserName><![CDATA[{stack.env['WECOM_CORP_ID']}]]></ToUserName>"
           f"<FromUserName><![CDATA[{employees[-4]}]]></FromUserName><CreateTime>{now}</CreateTime>"
           f"<MsgType><![CDATA[text]]></MsgType><Content><![CDATA[并发重复]]></Content>"
           f"<MsgId>{now}77</MsgId><AgentID>{stack.env['WECOM_AGENT_ID']}</AgentID></xml>")
    body = crypto.encrypt_reply(xml, str(now), "nonce1")
    import defusedxml.ElementTree as ET

    envelope = ET.fromstring(body)
    query = {"msg_signature": envelope.findtext("MsgSignature"), "timestamp": str(now), "nonce": "nonce1"}
    post = (f"<xml><ToUserName><![CDATA[{stack.env['WECOM_CORP_ID']}]]></ToUserName>"
            f"<Encrypt><![CDATA[{envelope.findtext('Encrypt')}]]></Encrypt></xml>")
    before = len(stack.outbox_rows())
    barrier = threading.Barrier(8)

    def fire(_):
        barrier.wait()
        return requests.post(stack.callback_url, params=query, data=post.encode(), timeout=10).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(fire, range(8)))
    assert codes == [200] * 8
    assert len(stack.outbox_rows()) == before + 1
    wait_for(lambda: any(r.endswith("并发重复") for r in stack.replies(employees[-4])), timeout=30, what="answer")
    time.sleep(1.5)
    assert sum(r.endswith("并发重复") for r in stack.replies(employees[-4])) == 1
