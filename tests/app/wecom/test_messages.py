"""parse_message: every message type and event of a self-built app, as WeCom sends them."""

import dataclasses
import logging

import pytest

from app.wecom import messages as m
from app.wecom.exceptions import MessageParseError
from app.wecom.messages import parse_message

HEAD = """<xml><ToUserName><![CDATA[ww1234567890abcdef]]></ToUserName>
<FromUserName><![CDATA[ZhangSan]]></FromUserName>
<CreateTime>1348831860</CreateTime>
"""
TAIL = "<AgentID>1000002</AgentID>\n</xml>"


def msg(msg_type: str, body: str, msg_id: str = "1234567890123456") -> str:
    return f"{HEAD}<MsgType><![CDATA[{msg_type}]]></MsgType>\n{body}\n<MsgId>{msg_id}</MsgId>\n{TAIL}"


def evt(event: str, body: str = "") -> str:
    return (f"{HEAD}<MsgType><![CDATA[event]]></MsgType>\n<Event><![CDATA[{event}]]></Event>\n"
            f"{body}\n{TAIL}")


def assert_common(parsed: m.Message) -> None:
    assert parsed.to_user == "ww1234567890abcdef"
    assert parsed.from_user == "ZhangSan"
    assert parsed.create_time == 1348831860
    assert parsed.agent_id == 1000002


def test_text():
    parsed = parse_message(msg("text", "<Content><![CDATA[你好, <b>world</b> ]]></Content>"))
    assert isinstance(parsed, m.TextMessage)
    assert_common(parsed)
    assert parsed.msg_type == "text"
    assert parsed.content == "你好, <b>world</b> "
    assert parsed.msg_id == "1234567890123456"
    assert parsed.event is None
    assert parsed.dedup_key == "msg:1234567890123456"


def test_text_without_cdata_and_as_bytes():
    xml = ("<xml><ToUserName>ww1</ToUserName><FromUserName>u1</FromUserName>"
           "<CreateTime>1</CreateTime><MsgType>text</MsgType><Content>a &amp; b</Content>"
           "<MsgId>9</MsgId><AgentID>7</AgentID></xml>")
    parsed = parse_message(xml.encode())
    assert isinstance(parsed, m.TextMessage)
    assert (parsed.content, parsed.agent_id, parsed.dedup_key) == ("a & b", 7, "msg:9")


def test_text_keeps_indentation_of_content():
    parsed = parse_message(msg("text", "<Content><![CDATA[\n    def f():\n        pass]]></Content>"))
    assert parsed.content == "\n    def f():\n        pass"


def test_image():
    parsed = parse_message(msg("image", "<PicUrl><![CDATA[https://p.qpic.cn/x]]></PicUrl>"
                                        "<MediaId><![CDATA[media_id]]></MediaId>"))
    assert isinstance(parsed, m.ImageMessage)
    assert_common(parsed)
    assert (parsed.pic_url, parsed.media_id) == ("https://p.qpic.cn/x", "media_id")


def test_voice():
    parsed = parse_message(msg("voice", "<MediaId><![CDATA[vid]]></MediaId><Format><![CDATA[amr]]></Format>"))
    assert isinstance(parsed, m.VoiceMessage)
    assert (parsed.media_id, parsed.format) == ("vid", "amr")


def test_video():
    parsed = parse_message(msg("video", "<MediaId><![CDATA[v]]></MediaId>"
                                        "<ThumbMediaId><![CDATA[t]]></ThumbMediaId>"))
    assert isinstance(parsed, m.VideoMessage)
    assert (parsed.media_id, parsed.thumb_media_id) == ("v", "t")


def test_location_message():
    parsed = parse_message(msg("location", "<Location_X>23.134521</Location_X>"
                                           "<Location_Y>113.358803</Location_Y><Scale>20</Scale>"
                                           "<Label><![CDATA[位置信息]]></Label>"))
    assert isinstance(parsed, m.LocationMessage)
    assert (parsed.location_x, parsed.location_y, parsed.scale, parsed.label) == (
        23.134521, 113.358803, 20, "位置信息")


def test_link():
    parsed = parse_message(msg("link", "<Title><![CDATA[this is a title!]]></Title>"
                                       "<Description><![CDATA[this is a description!]]></Description>"
                                       "<Url><![CDATA[https://example.com/a]]></Url>"
                                       "<PicUrl><![CDATA[https://example.com/p.png]]></PicUrl>"))
    assert isinstance(parsed, m.LinkMessage)
    assert (parsed.title, parsed.description, parsed.url, parsed.pic_url) == (
        "this is a title!", "this is a description!", "https://example.com/a",
        "https://example.com/p.png")


def test_messages_are_frozen():
    parsed = parse_message(msg("text", "<Content>x</Content>"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.content = "y"


@pytest.mark.parametrize(("event", "cls"), [
    ("subscribe", m.SubscribeEvent),
    ("unsubscribe", m.UnsubscribeEvent),
    ("enter_agent", m.EnterAgentEvent),
])
def test_plain_events(event, cls):
    parsed = parse_message(evt(event, "<EventKey><![CDATA[]]></EventKey>"))
    assert isinstance(parsed, cls)
    assert_common(parsed)
    assert parsed.msg_type == "event" and parsed.is_event
    assert parsed.event == event
    assert parsed.msg_id is None
    assert parsed.dedup_key == f"evt:ZhangSan:1348831860:{event}"


def test_event_name_is_lowercased():
    parsed = parse_message(evt("CLICK", "<EventKey><![CDATA[EVENTKEY]]></EventKey>"))
    assert isinstance(parsed, m.ClickEvent)
    assert parsed.event == "click"
    assert parsed.event_key == "EVENTKEY"
    assert parsed.dedup_key == "evt:ZhangSan:1348831860:click"


def test_view():
    parsed = parse_message(evt("view", "<EventKey><![CDATA[https://example.com/]]></EventKey>"))
    assert isinstance(parsed, m.ViewEvent)
    assert parsed.event_key == "https://example.com/"


def test_location_event():
    parsed = parse_message(evt("LOCATION", "<Latitude>23.104</Latitude><Longitude>113.320</Longitude>"
                                           "<Precision>65.000</Precision>"))
    assert isinstance(parsed, m.LocationEvent)
    assert (parsed.latitude, parsed.longitude, parsed.precision) == (23.104, 113.320, 65.0)
    assert parsed.event == "location"


def test_scancode_event():
    parsed = parse_message(evt("scancode_waitmsg", "<EventKey><![CDATA[#sendmsg#_0_0]]></EventKey>"
                                                   "<ScanCodeInfo><ScanType><![CDATA[qrcode]]></ScanType>"
                                                   "<ScanResult><![CDATA[1]]></ScanResult></ScanCodeInfo>"))
    assert isinstance(parsed, m.ScanCodeEvent)
    assert (parsed.event_key, parsed.scan_type, parsed.scan_result) == ("#sendmsg#_0_0", "qrcode", "1")


def test_template_card_event():
    parsed = parse_message(evt("template_card_event", "<EventKey><![CDATA[key111]]></EventKey>"
                                                      "<TaskId><![CDATA[taskid111]]></TaskId>"
                                                      "<CardType><![CDATA[text_notice]]></CardType>"
                                                      "<ResponseCode><![CDATA[rc]]></ResponseCode>"))
    assert isinstance(parsed, m.TemplateCardEvent)
    assert (parsed.event_key, parsed.task_id, parsed.card_type, parsed.response_code) == (
        "key111", "taskid111", "text_notice", "rc")


def test_unknown_message_type_is_kept_and_logged_without_content(caplog):
    caplog.set_level(logging.INFO, logger="app.wecom.messages")
    parsed = parse_message(msg("chatrecord", "<MediaId><![CDATA[secret-media]]></MediaId>"
                                             "<FileName><![CDATA[薪资.xlsx]]></FileName>"))
    assert isinstance(parsed, m.UnknownMessage)
    assert parsed.msg_type == "chatrecord"
    assert parsed.raw["FileName"] == "薪资.xlsx" and parsed.raw["MsgId"] == "1234567890123456"
    assert parsed.dedup_key == "msg:1234567890123456"
    assert "'chatrecord'" in caplog.text
    assert "薪资" not in caplog.text and "ZhangSan" not in caplog.text and "secret" not in caplog.text


def test_unknown_event_is_kept_with_nested_fields(caplog):
    caplog.set_level(logging.INFO, logger="app.wecom.messages")
    xml = evt("batch_job_result", "<BatchJob><JobId><![CDATA[S0MrnndvRG5fadSlLwiBqiDDbM143UqTmKP3152FZk4]]>"
                                  "</JobId><JobType><![CDATA[sync_user]]></JobType><ErrCode>0</ErrCode>"
                                  "<ErrMsg><![CDATA[ok]]></ErrMsg></BatchJob>")
    parsed = parse_message(xml)
    assert isinstance(parsed, m.UnknownEvent)
    assert parsed.event == "batch_job_result"
    assert parsed.raw["BatchJob"]["JobType"] == "sync_user"
    assert parsed.msg_id is None
    assert "batch_job_result" in caplog.text and "ZhangSan" not in caplog.text


def test_repeated_tags_become_lists():
    xml = evt("pic_sysphoto", "<EventKey>k</EventKey><SendPicsInfo><Count>2</Count><PicList>"
                              "<item><PicMd5Sum>a</PicMd5Sum></item><item><PicMd5Sum>b</PicMd5Sum></item>"
                              "</PicList></SendPicsInfo>")
    parsed = parse_message(xml)
    assert [i["PicMd5Sum"] for i in parsed.raw["SendPicsInfo"]["PicList"]["item"]] == ["a", "b"]


def test_missing_agent_id_is_none():
    parsed = parse_message(msg("text", "<Content>x</Content>").replace("<AgentID>1000002</AgentID>", ""))
    assert parsed.agent_id is None


@pytest.mark.parametrize("xml", [
    "",
    "not xml",
    "<xml><ToUserName>a</ToUserName>",
    "<root><ToUserName>a</ToUserName></root>",
    msg("text", "<Content>x</Content>").replace("<MsgId>1234567890123456</MsgId>", ""),
    msg("text", ""),
    msg("image", "<PicUrl>u</PicUrl>"),
    msg("text", "<Content>x</Content>").replace("1348831860", "yesterday"),
    msg("text", "<Content>x</Content>").replace("1348831860", str(2**63)),  # past the 64-bit column
    msg("text", "<Content>x</Content>").replace("1348831860", "-5"),
    msg("text", "<Content>x</Content>").replace("<FromUserName><![CDATA[ZhangSan]]></FromUserName>", ""),
    msg("text", "<Content>x</Content>").replace("1000002", "abc"),
    msg("location", "<Location_X>north</Location_X><Location_Y>1</Location_Y><Scale>1</Scale>"),
    evt("", ""),
    evt("location", "<Latitude>1</Latitude>"),
])
def test_malformed_or_incomplete_raises(xml):
    with pytest.raises(MessageParseError) as info:
        parse_message(xml)
    assert isinstance(info.value, ValueError)
    assert info.value.args[0]


def test_billion_laughs_is_refused_quickly():
    bomb = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
            + "".join(f'<!ENTITY lol{i} "{"&lol%s;" % ("" if i == 1 else i - 1) * 10}">' for i in range(1, 10))
            + ']><xml><ToUserName>&lol9;</ToUserName></xml>')
    with pytest.raises(MessageParseError, match="forbidden"):
        parse_message(bomb)


def test_xxe_is_refused():
    xxe = ('<?xml version="1.0"?><!DOCTYPE xml [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>'
           "<xml><ToUserName>&xxe;</ToUserName><FromUserName>u</FromUserName>"
           "<CreateTime>1</CreateTime><MsgType>text</MsgType><Content>&xxe;</Content><MsgId>1</MsgId></xml>")
    with pytest.raises(MessageParseError, match="forbidden"):
        parse_message(xxe)


def test_oversized_body_is_refused():
    with pytest.raises(MessageParseError, match="too large"):
        parse_message(msg("text", "<Content>" + "a" * (m.MAX_XML_BYTES + 1) + "</Content>"))


def test_change_contact_names_the_member_and_each_change_is_its_own_event():
    """通讯录变更 (from "sys", no AgentID): two members, or one member twice, changed in one
    second are separate events; WeCom's retry of one (the same fields) is a duplicate."""
    def change(user: str, departments: str) -> m.ContactChangeEvent:
        return parse_message(
            "<xml><ToUserName><![CDATA[ww1234567890abcdef]]></ToUserName><FromUserName><![CDATA[sys]]>"
            "</FromUserName><CreateTime>1403610513</CreateTime><MsgType><![CDATA[event]]></MsgType>"
            "<Event><![CDATA[change_contact]]></Event><ChangeType>update_user</ChangeType>"
            f"<UserID><![CDATA[{user}]]></UserID><Department><![CDATA[{departments}]]></Department>"
            "<MainDepartment>1</MainDepartment></xml>")

    parsed = change("zhangsan", "1,2,3")
    assert isinstance(parsed, m.ContactChangeEvent) and parsed.agent_id is None
    assert (parsed.change_type, parsed.user_id, parsed.departments) == ("update_user", "zhangsan", "1,2,3")
    keys = {change(u, d).dedup_key for u, d in (("zhangsan", "1,2,3"), ("lisi", "1,2,3"), ("zhangsan", "1"))}
    assert len(keys) == 3 and change("zhangsan", "1").dedup_key in keys
