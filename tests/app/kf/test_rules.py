"""kf_msg_or_event parsed, and what kf/send_msg allows."""

import time

from app.kf import rules
from app.kf.messages import customer_message
from app.wecom.kf import TEXT_LIMIT
from app.wecom.messages import KfEvent, parse_message

EVENT = ("<xml><ToUserName><![CDATA[ww1]]></ToUserName><CreateTime>1348831860</CreateTime>"
         "<MsgType><![CDATA[event]]></MsgType><Event><![CDATA[kf_msg_or_event]]></Event>"
         "<Token><![CDATA[ENCApHxnGDNAVNY4AaSJKj4Tb5mwsEMzxhFmHVGcra996NR]]></Token>"
         "<OpenKfId><![CDATA[wkAJ2GCAAASSm4_FhToWMFea0xAFfd3Q]]></OpenKfId></xml>")


def test_the_event_parses_without_a_sender_and_dedups_on_its_token():
    event = parse_message(EVENT)
    assert isinstance(event, KfEvent)
    assert event.open_kfid == "wkAJ2GCAAASSm4_FhToWMFea0xAFfd3Q" and event.token.startswith("ENC")
    assert event.from_user == event.open_kfid and event.agent_id is None
    assert event.dedup_key == parse_message(EVENT).dedup_key
    assert event.dedup_key != parse_message(EVENT.replace("ENCA", "ENCB")).dedup_key


def test_only_a_customers_well_formed_message_is_taken():
    base = {"msgid": "m1", "open_kfid": "wk1", "external_userid": "wm1", "send_time": 5, "origin": 3,
            "msgtype": "text", "text": {"content": "你好"}}
    m = customer_message(base, "ww1")
    assert (m.from_user, m.msg_type, m.content, m.create_time) == ("kf:wm1", "text", "你好", 5)
    assert customer_message({**base, "origin": 5}, "ww1") is None
    assert customer_message({**base, "external_userid": None}, "ww1") is None
    assert customer_message({**base, "msgtype": "image"}, "ww1").msg_type == "kf_image"


def test_a_long_reply_is_five_messages_at_most_each_within_the_limit():
    chunks = rules.fit_messages("很长的回答。" * 3000)
    assert len(chunks) == rules.MAX_MESSAGES
    assert all(len(c.encode()) <= TEXT_LIMIT for c in chunks)
    assert chunks[-1].endswith(rules.CUT_NOTE)
    assert rules.fit_messages("短") == ["短"]


def test_the_window_and_asking_for_a_person():
    now = time.time()
    assert rules.within_window(int(now) - 47 * 3600, now)
    assert not rules.within_window(int(now) - 49 * 3600, now)
    terms = ("转人工", "talk to a human")
    assert rules.asks_for_human("请帮我转人工", terms)
    assert rules.asks_for_human("Human!", terms)
    assert not rules.asks_for_human("human resources policy?", terms)
