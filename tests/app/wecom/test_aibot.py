"""The AI bot's JSON protocol: parsing callbacks, @mentions, encrypted stream replies."""

import json

import pytest

from app.wecom import aibot
from app.wecom.crypto import WeComCrypto
from app.wecom.exceptions import MessageParseError, ValidateCorpIdError, ValidateSignatureError
from scripts.dev_env import random_aes_key

KEY = random_aes_key()


def message(**fields) -> str:
    body = {"msgid": "m1", "aibotid": "aib1", "chattype": "single", "from": {"userid": "zhangwei"},
            "response_url": "https://example.invalid/r", "msgtype": "text", "text": {"content": "你好"}}
    body.update(fields)
    return json.dumps(body, ensure_ascii=False)


def test_text_message():
    parsed = aibot.parse_message(message(), received_at=1700000000)
    assert (parsed.msg_id, parsed.msg_type, parsed.from_user, parsed.content) == ("m1", "text", "zhangwei", "你好")
    assert parsed.dedup_key == "msg:m1" and not parsed.is_group and parsed.create_time == 1700000000


def test_group_message_needs_chatid():
    parsed = aibot.parse_message(message(chattype="group", chatid="wr1"), 0)
    assert parsed.is_group and parsed.chat_id == "wr1"
    with pytest.raises(MessageParseError, match="chatid"):
        aibot.parse_message(message(chattype="group"), 0)


def test_mixed_message_keeps_its_text_items():
    parsed = aibot.parse_message(message(msgtype="mixed", text=None, mixed={"msg_item": [
        {"msgtype": "text", "text": {"content": "看看这张图"}},
        {"msgtype": "image", "image": {"url": "https://example.invalid/i"}},
        {"msgtype": "text", "text": {"content": "是什么？"}}]}), 0)
    assert parsed.content == "看看这张图\n是什么？" and parsed.raw_types == ("text", "image", "text")


def test_stream_refresh_and_event():
    refresh = aibot.parse_message(json.dumps({"msgid": "r1", "msgtype": "stream", "stream": {"id": "S1"}}), 0)
    assert refresh.msg_type == "stream" and refresh.stream_id == "S1"
    event = aibot.parse_message(json.dumps({"msgtype": "event", "from": {"userid": "u"},
                                            "event": {"eventtype": "enter_chat"}}), 0)
    assert event.event == "enter_chat"


@pytest.mark.parametrize("plaintext, reason", [
    ("not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    (json.dumps({"msgid": "m"}), "msgtype"),
    (json.dumps({"msgtype": "stream", "stream": {}}), "stream.id"),
    (message(msgid=""), "msgid"),
    (message(**{"from": {}}), "from.userid"),
    (message(chattype="channel"), "chattype"),
    (message(msgid={"nested": 1}), "msgid must be a string"),
    (message(msgtype="mixed", mixed={"msg_item": "x"}), "msg_item"),
])
def test_malformed_messages_are_refused_with_a_reason(plaintext, reason):
    with pytest.raises(MessageParseError, match=reason):
        aibot.parse_message(plaintext, 0)


@pytest.mark.parametrize("body, reason", [
    (b"<xml/>", "not JSON"), (b'{"encrypt": ""}', "no encrypt"), (b'["encrypt"]', "no encrypt"),
    (b'{"encrypt": 5}', "no encrypt"), (b"\xff\xfe", "not JSON"),
])
def test_envelope_errors(body, reason):
    with pytest.raises(aibot.AibotRequestError, match=reason):
        aibot.extract_encrypt(body)


def test_envelope():
    assert aibot.extract_encrypt(b'{"encrypt": " abc== "}') == "abc=="


@pytest.mark.parametrize("text, expected", [
    ("@小星 年假有几天", "年假有几天"),
    ("@小星\u2005年假有几天", "年假有几天"),
    ("请问 @小星 年假有几天", "请问 年假有几天"),
    ("年假有几天 @小星", "年假有几天"),
    ("@小星", ""),
    ("@小星星 你好", None),  # another name that starts like ours
    ("年假有几天", None),
    ("小星 年假", None),
])
def test_mentions(text, expected):
    assert aibot.strip_mention(text, "小星") == expected


def test_no_bot_name_means_no_mention():
    assert aibot.strip_mention("@ 你好", "") is None


def test_encrypted_stream_reply_round_trip_with_receive_id_empty():
    crypto = WeComCrypto("tok", KEY, "")
    reply = aibot.encrypt_reply(crypto, aibot.stream_message("S1", "答复", False), "1700000000", "n1")
    assert set(reply) == {"encrypt", "msgsignature", "timestamp", "nonce"}
    assert reply["msgsignature"] == crypto.signature("1700000000", "n1", reply["encrypt"])
    decoded = aibot.decrypt_reply(crypto, json.dumps(reply))
    assert decoded == {"msgtype": "stream", "stream": {"id": "S1", "finish": False, "content": "答复"}}


def test_reply_is_checked():
    crypto = WeComCrypto("tok", KEY, "")
    reply = aibot.encrypt_reply(crypto, aibot.text_message("欢迎"), "1", "n")
    with pytest.raises(ValidateSignatureError):
        aibot.decrypt_reply(WeComCrypto("other", KEY, ""), json.dumps(reply))
    with pytest.raises(ValidateCorpIdError):  # an app's receive id is not the bot's ""
        aibot.decrypt_reply(WeComCrypto("tok", KEY, "wwcorp"), json.dumps(reply))
