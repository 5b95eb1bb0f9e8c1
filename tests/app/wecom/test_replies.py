"""Passive text replies round-trip through the parser's XML reader."""

import pytest
from defusedxml import ElementTree

from app.wecom.messages import parse_message
from app.wecom.replies import TEXT_REPLY_LIMIT, build_text_reply, text_reply_to


def test_text_reply_fields():
    root = ElementTree.fromstring(build_text_reply("ZhangSan", "ww1", "你好 ]]> <b>&", create_time=5))
    assert root.findtext("ToUserName") == "ZhangSan"
    assert root.findtext("FromUserName") == "ww1"
    assert root.findtext("CreateTime") == "5"
    assert root.findtext("MsgType") == "text"
    assert root.findtext("Content") == "你好 ]]> <b>&"


def test_reply_to_swaps_sender_and_receiver():
    incoming = parse_message("<xml><ToUserName>ww1</ToUserName><FromUserName>u1</FromUserName>"
                             "<CreateTime>1</CreateTime><MsgType>text</MsgType><Content>hi</Content>"
                             "<MsgId>1</MsgId><AgentID>2</AgentID></xml>")
    root = ElementTree.fromstring(text_reply_to(incoming, "ok\x00"))
    assert (root.findtext("ToUserName"), root.findtext("FromUserName")) == ("u1", "ww1")
    assert root.findtext("Content") == "ok"


def test_reply_over_limit_is_refused():
    with pytest.raises(ValueError):
        build_text_reply("u", "c", "字" * (TEXT_REPLY_LIMIT // 3 + 1))
