"""The message registry (app/wecom/messages.py): MsgType and Event -> class, one table each, the
one place a new type is added; parsing goes through it and nothing else."""

from __future__ import annotations

import dataclasses

import pytest

from app.wecom import messages as m
from app.wecom.exceptions import MessageParseError
from app.wecom.messages import parse_message
from tests.app.wecom.test_messages import evt, msg

# one callback for every registered type, as WeCom sends it, and the fields it must come back with
MESSAGES = {
    "text": ("<Content><![CDATA[你好]]></Content>", {"content": "你好"}),
    "image": ("<PicUrl>http://p/1</PicUrl><MediaId>M1</MediaId>", {"pic_url": "http://p/1", "media_id": "M1"}),
    "voice": ("<MediaId>M2</MediaId><Format>amr</Format>", {"media_id": "M2", "format": "amr"}),
    "file": ("<MediaId>M3</MediaId><Title>手册.pdf</Title>", {"media_id": "M3", "file_name": "手册.pdf"}),
    "video": ("<MediaId>M4</MediaId><ThumbMediaId>T4</ThumbMediaId>",
              {"media_id": "M4", "thumb_media_id": "T4"}),
    "location": ("<Location_X>23.1</Location_X><Location_Y>113.3</Location_Y><Scale>15</Scale>"
                 "<Label>广州</Label>", {"location_x": 23.1, "location_y": 113.3, "scale": 15, "label": "广州"}),
    "link": ("<Title>t</Title><Description>d</Description><Url>http://u</Url><PicUrl>http://p</PicUrl>",
             {"title": "t", "description": "d", "url": "http://u", "pic_url": "http://p"}),
}
EVENTS = {
    "subscribe": ("", {}),
    "unsubscribe": ("", {}),
    "enter_agent": ("<EventKey></EventKey>", {"event_key": ""}),
    "click": ("<EventKey>K1</EventKey>", {"event_key": "K1"}),
    "view": ("<EventKey>http://v</EventKey>", {"event_key": "http://v"}),
    "location": ("<Latitude>23.1</Latitude><Longitude>113.3</Longitude><Precision>30</Precision>",
                 {"latitude": 23.1, "longitude": 113.3, "precision": 30.0}),
    "scancode_push": ("<EventKey>S</EventKey><ScanCodeInfo><ScanType>qrcode</ScanType>"
                      "<ScanResult>R</ScanResult></ScanCodeInfo>",
                      {"event_key": "S", "scan_type": "qrcode", "scan_result": "R"}),
    "scancode_waitmsg": ("<EventKey>S</EventKey><ScanCodeInfo><ScanType>barcode</ScanType>"
                         "<ScanResult>R</ScanResult></ScanCodeInfo>",
                         {"event_key": "S", "scan_type": "barcode", "scan_result": "R"}),
    "template_card_event": ("<EventKey>good</EventKey><TaskId>T</TaskId><CardType>button_interaction"
                            "</CardType><ResponseCode>RC</ResponseCode>",
                            {"event_key": "good", "task_id": "T", "card_type": "button_interaction",
                             "response_code": "RC", "selected": {}}),
    "change_contact": ("<ChangeType>update_user</ChangeType><UserID>u1</UserID><NewUserID>u2</NewUserID>"
                       "<Department>1,2</Department>",
                       {"change_type": "update_user", "user_id": "u1", "new_user_id": "u2",
                        "departments": "1,2"}),
    "kf_msg_or_event": ("<Token>ENCApHxnGDNAVNY4AaSJKj4Tb5mwsEMzxhFmHVGcra996NR</Token><OpenKfId>wkAJ2GCAAAZSfhHCt7IFSvLKtMPxyJTw</OpenKfId>",
                         {"token": "ENCApHxnGDNAVNY4AaSJKj4Tb5mwsEMzxhFmHVGcra996NR",
                          "open_kfid": "wkAJ2GCAAAZSfhHCt7IFSvLKtMPxyJTw"}),
}
COMMON = {f.name for f in dataclasses.fields(m.Message)}


def own_fields(parsed: m.Message) -> dict:
    return {k: v for k, v in dataclasses.asdict(parsed).items() if k not in COMMON}


def test_the_tables_hold_every_type_wecom_sends_an_app():
    assert set(m.MESSAGE_TYPES) == set(MESSAGES)
    assert set(m.EVENT_TYPES) == set(EVENTS)


@pytest.mark.parametrize("msg_type", sorted(MESSAGES))
def test_a_message_is_read_as_its_registered_class(msg_type):
    body, fields = MESSAGES[msg_type]
    parsed = parse_message(msg(msg_type, body))
    assert type(parsed) is m.MESSAGE_TYPES[msg_type]
    assert own_fields(parsed) == fields and parsed.msg_id == "1234567890123456" and parsed.event is None


@pytest.mark.parametrize("event", sorted(EVENTS))
def test_an_event_is_read_as_its_registered_class(event):
    body, fields = EVENTS[event]
    parsed = parse_message(evt(event, body))
    assert type(parsed) is m.EVENT_TYPES[event]
    assert own_fields(parsed) == fields and parsed.event == event and parsed.msg_id is None


def test_parsing_goes_through_the_table(monkeypatch):
    monkeypatch.delitem(m.MESSAGE_TYPES, "text")
    parsed = parse_message(msg("text", "<Content>hi</Content>"))
    assert isinstance(parsed, m.UnknownMessage) and parsed.raw["Content"] == "hi"
    monkeypatch.delitem(m.EVENT_TYPES, "click")
    assert isinstance(parse_message(evt("click", "<EventKey>K</EventKey>")), m.UnknownEvent)


def test_a_new_type_is_added_in_one_place(monkeypatch):
    monkeypatch.setattr(m, "MESSAGE_TYPES", dict(m.MESSAGE_TYPES))

    @m.message_type("markdown")
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class MarkdownMessage(m.Message):
        content: str

        @staticmethod
        def read(f):
            return {"content": m._required(f, "Content")}

    parsed = parse_message(msg("markdown", "<Content>**b**</Content>"))
    assert type(parsed) is MarkdownMessage and parsed.content == "**b**"
    with pytest.raises(MessageParseError, match="missing Content"):  # its own fields, checked
        parse_message(msg("markdown", ""))


def test_one_type_cannot_be_read_two_ways():
    with pytest.raises(ValueError, match="'text' is already read as TextMessage"):
        m.message_type("text")(type("Other", (m.Message,), {}))
    assert m.MESSAGE_TYPES["text"] is m.TextMessage
    assert m.message_type("text")(m.TextMessage) is m.TextMessage  # registering again is harmless
