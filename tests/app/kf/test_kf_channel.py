"""微信客服 end to end: a customer on WeChat (the emulator) -> kf_msg_or_event on the callback URL
-> gunicorn -> outbox -> Celery (kf/sync_msg from the stored cursor, the ordinary answer path)
-> kf/send_msg, with real PostgreSQL, Redis and Celery."""

import signal
import time

import pytest
import requests

from tests.support.stack import Stack, select_rows, wait_for

pytestmark = pytest.mark.integration

SERVICER = "zhangsan"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("kf"), db_kind="postgres", redis_db=11, model_delay_s=0.5,
              worker_concurrency=4,
              extra_env={"KF_ENABLED": "true", "KF_SERVICER_USERID": SERVICER,
                         "CLAIM_LEASE_S": "4", "SWEEP_QUEUED_AFTER_S": "3"}).start()
    yield s
    s.stop()


def customer_says(stack, customer: str, content: str, **fields) -> dict:
    return stack.emu("POST", "kf/send", json={"external_userid": customer, "content": content, **fields})


def received(stack, customer: str) -> list[str]:
    return [m["content"] for m in stack.emu("GET", "kf/messages",
                                            params={"external_userid": customer})["messages"]]


def session(stack, customer: str) -> dict:
    return next(s for s in stack.emu("GET", "kf/sessions")["sessions"] if s["external_userid"] == customer)


def kf_rows(stack) -> list[dict]:
    return select_rows(stack.db.url, "SELECT id, status, msg_type, event, failure_reason, user_hash "
                                     "FROM inbound_messages WHERE channel = 'kf' ORDER BY id")


def test_a_customer_is_answered_once_though_wecom_calls_back_twice(stack):
    customer = "wmCustomerDup01"
    customer_says(stack, customer, "你们几点开门", force_retry=True)
    wait_for(lambda: received(stack, customer), timeout=60, what="the answer")
    time.sleep(3)  # a second answer, if the retried callback made one, arrives now
    assert received(stack, customer) == ["答复#1: 你们几点开门"]
    customers = [r for r in kf_rows(stack) if r["msg_type"] == "text"]
    assert [r["status"] for r in customers] == ["answered"]
    assert customer not in str(customers)  # the customer's id is sealed, hashed in user_hash
    cursor = select_rows(stack.db.url, "SELECT cursor, synced FROM kf_cursors")
    assert cursor[0]["synced"] >= 1
    for name in ("web", "worker"):
        assert customer not in stack.log(name), f"the customer's id reached the {name} log"


def test_asking_for_a_person_hands_over_and_the_bot_keeps_silent_until_the_session_ends(stack):
    customer = "wmCustomerHuman01"
    customer_says(stack, customer, "转人工")
    wait_for(lambda: session(stack, customer)["state"] == 3, timeout=60, what="the hand-over")
    assert session(stack, customer)["servicer_userid"] == SERVICER
    assert len(received(stack, customer)) == 1 and "人工" in received(stack, customer)[0]

    customer_says(stack, customer, "还在吗")
    wait_for(lambda: any(r["failure_reason"] == "kf: a person serves the customer" for r in kf_rows(stack)),
             timeout=60, what="the message a person answers")
    assert len(received(stack, customer)) == 1  # the bot said nothing

    stack.emu("POST", "kf/end", json={"external_userid": customer})
    customer_says(stack, customer, "再问一个问题")
    wait_for(lambda: len(received(stack, customer)) == 2, timeout=60, what="the bot's answer again")
    assert received(stack, customer)[1].endswith("再问一个问题")


def test_a_message_past_the_48_hour_window_is_not_answered(stack):
    customer = "wmCustomerLate01"
    customer_says(stack, customer, "很久以前的问题", send_time=int(time.time()) - 49 * 3600)
    wait_for(lambda: any(r["failure_reason"] == "kf: outside the 48-hour window" for r in kf_rows(stack)),
             timeout=60, what="the late message's row")
    assert received(stack, customer) == []


def test_a_worker_killed_mid_batch_loses_and_doubles_nothing(stack):
    customers = [f"wmCustomerKill{i:02d}" for i in range(4)]
    for c in customers:
        customer_says(stack, c, f"{c} 的问题")
    wait_for(lambda: sum(len(received(stack, c)) for c in customers) >= 1, timeout=60,
             what="the first answer of the batch")
    stack.kill("worker", signal.SIGKILL)
    stack.start_worker()
    wait_for(stack.worker_ready, 60, what="the restarted worker")
    wait_for(lambda: all(received(stack, c) for c in customers), timeout=90, what="every answer")
    time.sleep(4)  # a redelivered task of the killed worker would answer twice now
    for c in customers:
        assert received(stack, c) == [f"答复#1: {c} 的问题"]


def test_send_msg_keeps_wecom_rules(stack):
    """The emulator holds the app to kf/send_msg's rules: 5 messages a customer message, a
    msgid once, nothing while a person serves."""
    customer = "wmCustomerRules01"
    customer_says(stack, customer, "你好")
    wait_for(lambda: received(stack, customer), timeout=60, what="the answer")
    token = requests.get(f"{stack.emulator.url}/cgi-bin/gettoken", timeout=5, params={
        "corpid": stack.env["WECOM_CORP_ID"], "corpsecret": stack.env["WECOM_SECRET"]}).json()["access_token"]

    def send(msgid):
        return requests.post(f"{stack.emulator.url}/cgi-bin/kf/send_msg", params={"access_token": token},
                             json={"touser": customer, "open_kfid": "wkEmulatorKf000001", "msgid": msgid,
                                   "msgtype": "text", "text": {"content": "x"}}, timeout=5).json()["errcode"]

    assert [send(f"rule-{i}") for i in range(5)] == [0, 0, 0, 0, 95001]  # 1 answer + 4 = 5
    assert send("rule-0") == 95017


def test_a_hand_over_that_failed_once_is_retried_and_the_notice_sent_once(stack):
    """kf/service_state/trans answers 502 after the notice went out: the retry sends the notice
    again with the same msgid (WeCom drops it: 95017) and hands over."""
    customer = "wmCustomerRetry01"
    stack.emu("POST", "faults", json={"api": "kf/service_state/trans", "http_status": 502})
    customer_says(stack, customer, "人工")
    wait_for(lambda: session(stack, customer)["state"] == 3, timeout=60, what="the retried hand-over")
    assert len(received(stack, customer)) == 1
    assert stack.emu("GET", "kf/sessions")["counts"].get("duplicate_msgid", 0) >= 1


def test_over_the_channels_budget_a_customer_is_handed_to_a_person(stack):
    """Last in the module (the budget stays): a money budget on the kf ledger line, used up,
    hands the customer over instead of showing an employee's budget notice."""
    from app.accounting import set_budget, set_price
    from app.db import Database
    from app.kf.rules import HANDOVER_NOTICE

    db = Database(stack.db.url)
    try:
        with db.transaction() as tx:
            set_price(tx, "fake-glm", 2000, 2000, 2000)  # CNY per million tokens
            set_budget(tx, "department", "kf", "day", "0.0001", action="block")
    finally:
        db.dispose()
    customer = "wmCustomerBudget01"
    customer_says(stack, customer, "第一个问题")  # admitted: it spends the budget past its limit
    wait_for(lambda: received(stack, customer), timeout=60, what="the first answer")
    customer_says(stack, customer, "第二个问题")
    wait_for(lambda: session(stack, customer)["state"] == 3, timeout=60, what="the hand-over")
    assert received(stack, customer) == ["答复#1: 第一个问题", HANDOVER_NOTICE]
    assert not any("Budget used up" in m for m in received(stack, customer))
