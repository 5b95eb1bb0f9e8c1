"""The WeCom emulator: API behaviour, fault injection, callbacks as WeCom sends them, the chat page."""

from __future__ import annotations

import os
import threading
import time

import pytest
import requests
from defusedxml import ElementTree
from flask import Flask, request
from werkzeug.serving import make_server

from app.wecom.crypto import WeComCrypto
from emulator import EmulatorConfig, EmulatorServer, create_emulator
from emulator.__main__ import parse_args
from emulator.callbacks import build_callback_xml

FAST = dict(retry_interval=0.05, callback_timeout=2.0, retries=3)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Receiver:
    """The app's /wecom/callback in miniature: checks the signature, decrypts, records, answers.

    ``script`` is a list of (status, delay) consumed one per POST; afterwards it answers 200.
    """

    def __init__(self, config: EmulatorConfig):
        self.crypto = WeComCrypto(config.token, config.aes_key, config.corp_id)
        self.corp_id = config.corp_id
        self.script: list[tuple[int, float]] = []
        self.posts: list[dict] = []
        self.reply: str | None = None
        self.echo_wrong = False
        self.lock = threading.Lock()
        app = Flask("receiver")
        app.add_url_rule("/wecom/callback", "cb", self.handle, methods=["GET", "POST"])
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}/wecom/callback"

    def handle(self):
        args = request.args
        if request.method == "GET":
            plain = self.crypto.verify_url(args["msg_signature"], args["timestamp"], args["nonce"],
                                           args["echostr"])
            return "not-it" if self.echo_wrong else plain
        body = request.get_data()
        envelope = ElementTree.fromstring(body)
        xml = self.crypto.decrypt_message(body, args["msg_signature"], args["timestamp"], args["nonce"])
        with self.lock:
            self.posts.append({"xml": ElementTree.fromstring(xml), "raw": xml, "args": dict(args),
                               "envelope": envelope, "ua": request.headers.get("User-Agent"),
                               "content_type": request.headers.get("Content-Type")})
            status, delay = self.script.pop(0) if self.script else (200, 0.0)
        if delay:
            time.sleep(delay)
        if status == 200 and self.reply is not None:
            reply = (f"<xml><ToUserName><![CDATA[x]]></ToUserName><FromUserName><![CDATA[{self.corp_id}]]>"
                     f"</FromUserName><CreateTime>1</CreateTime><MsgType><![CDATA[text]]></MsgType>"
                     f"<Content><![CDATA[{self.reply}]]></Content></xml>")
            return self.crypto.encrypt_reply(reply, args["timestamp"], "123456")
        return "", status

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(2)


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


@pytest.fixture
def emu():
    with EmulatorServer(EmulatorConfig(**FAST)) as server:
        yield server


@pytest.fixture
def receiver_emu():
    config = EmulatorConfig(**FAST)
    with Receiver(config) as receiver:
        config.callback_url = receiver.url
        with EmulatorServer(config) as server:
            yield server, receiver


def gettoken(emu, **params):
    cfg = emu.state.config
    query = {"corpid": cfg.corp_id, "corpsecret": cfg.secret, **params}
    return requests.get(emu.url + "/cgi-bin/gettoken", params=query, timeout=5).json()


def token(emu) -> str:
    return gettoken(emu)["access_token"]


def send(emu, body=None, access_token=None, **fields):
    body = body if body is not None else {
        "touser": "zhangwei", "msgtype": "text", "agentid": emu.state.config.agent_id,
        "text": {"content": "你好"}, **fields}
    return requests.post(emu.url + "/cgi-bin/message/send",
                         params={"access_token": access_token or token(emu)}, json=body, timeout=5).json()


def admin(emu, method, path, **kw):
    return requests.request(method, emu.url + "/_emulator/" + path, timeout=5, **kw)


# -- gettoken ---------------------------------------------------------------------------------
def test_gettoken_answers_like_wecom(emu):
    answer = gettoken(emu)
    assert answer["errcode"] == 0 and answer["errmsg"] == "ok"
    assert answer["expires_in"] == 7200 and len(answer["access_token"]) > 64
    again = gettoken(emu)
    assert again["access_token"] == answer["access_token"]  # same token while valid
    assert 7190 <= again["expires_in"] <= 7200


def test_gettoken_rejects_bad_credentials(emu):
    assert gettoken(emu, corpid="wwnotmine")["errcode"] == 40013
    bad = gettoken(emu, corpsecret="wrong")
    assert bad["errcode"] == 40001 and "more info at" in bad["errmsg"] and "access_token" not in bad
    assert gettoken(emu, corpid="")["errcode"] == 41002
    assert gettoken(emu, corpsecret="")["errcode"] == 41004


def test_tokens_expire_after_ttl_and_may_coexist():
    config = EmulatorConfig(token_ttl=60, token_reuse=False)
    with EmulatorServer(config) as emu:
        clock = FakeClock()
        emu.state.clock = clock
        first, second = token(emu), token(emu)
        assert first != second
        assert send(emu, access_token=first)["errcode"] == 0  # both valid at once
        assert send(emu, access_token=second)["errcode"] == 0
        clock.now += 61
        assert send(emu, access_token=first)["errcode"] == 42001
        third = token(emu)
        assert third not in (first, second) and send(emu, access_token=third)["errcode"] == 0
        assert send(emu, access_token="forged")["errcode"] == 40014
        no_token = requests.post(emu.url + "/cgi-bin/message/send", json={}, timeout=5).json()
        assert no_token["errcode"] == 41001


def test_reused_token_is_replaced_once_expired(emu):
    clock = FakeClock()
    emu.state.clock = clock
    first = token(emu)
    clock.now += 7201
    assert send(emu, access_token=first)["errcode"] == 42001
    assert token(emu) != first


def test_admin_can_expire_tokens_early(emu):
    t = token(emu)
    assert admin(emu, "POST", "tokens/expire").json() == {"expired": 1}
    assert send(emu, access_token=t)["errcode"] == 42001


# -- message/send -----------------------------------------------------------------------------
def test_message_send_delivers_and_records_in_order(emu):
    t = token(emu)
    first = send(emu, access_token=t)
    assert first["errcode"] == 0 and first["msgid"]
    send(emu, access_token=t, text={"content": "第二条"}, touser="lina|ZhangWei")
    msgs = admin(emu, "GET", "messages").json()["messages"]
    assert [(m["touser"], m["content"]) for m in msgs] == [
        ("zhangwei", "你好"), ("lina", "第二条"), ("zhangwei", "第二条")]
    assert [m["seq"] for m in msgs] == sorted(m["seq"] for m in msgs)
    assert msgs[1]["msgid"] == msgs[2]["msgid"] != msgs[0]["msgid"]
    mine = admin(emu, "GET", "messages", params={"touser": "zhangwei", "since": msgs[0]["seq"]}).json()
    assert [m["content"] for m in mine["messages"]] == ["第二条"]


def test_message_send_reports_invalid_receivers(emu):
    t = token(emu)
    partial = send(emu, access_token=t, touser="zhangwei|Nobody|ghost", toparty="999", totag="1")
    assert partial["errcode"] == 0
    assert partial["invaliduser"] == "nobody|ghost"
    assert partial["invalidparty"] == "999" and partial["invalidtag"] == "1"
    none = send(emu, access_token=t, touser="nobody")
    assert none["errcode"] == 81013 and none["invaliduser"] == "nobody"
    assert send(emu, access_token=t, touser="")["errcode"] == 81013
    everyone = send(emu, access_token=t, touser="@all")
    assert everyone["errcode"] == 0
    party = send(emu, access_token=t, touser="", toparty="2", text={"content": "研发中心"})
    assert party["errcode"] == 0
    reached = {m["touser"] for m in admin(emu, "GET", "messages").json()["messages"]
               if m["content"] == "研发中心"}
    assert reached == {"zhangwei", "liuyang", "lina", "wangfang"}  # 研发中心 and 算法组 below it


def test_message_send_enforces_byte_limits(emu):
    t = token(emu)
    agent = emu.state.config.agent_id

    def text(content, msgtype="text"):
        return send(emu, {"touser": "zhangwei", "msgtype": msgtype, "agentid": agent,
                          msgtype: {"content": content}}, access_token=t)["errcode"]

    assert text("汉" * 682 + "ab") == 0  # 2048 bytes exactly
    assert text("汉" * 682 + "abc") == 45002
    assert text("汉" * 1365 + "a", "markdown") == 0  # 4096 bytes
    assert text("汉" * 1365 + "ab", "markdown") == 45002
    assert text("") == 44004
    assert send(emu, {"touser": "zhangwei", "msgtype": "text", "agentid": agent, "text": {}},
                access_token=t)["errcode"] == 44004


def test_oversize_truncate_mode_cuts_at_a_character_boundary():
    with EmulatorServer(EmulatorConfig(oversize="truncate")) as emu:
        assert send(emu, text={"content": "汉" * 700})["errcode"] == 0
        stored = emu.state.messages[-1]["content"]
        assert stored == "汉" * 682 and len(stored.encode()) <= 2048


def test_message_send_validates_the_body(emu):
    t = token(emu)
    agent = emu.state.config.agent_id
    assert send(emu, access_token=t, agentid=agent + 1)["errcode"] == 301002
    assert send(emu, {"touser": "zhangwei", "msgtype": "text", "text": {"content": "x"}},
                access_token=t)["errcode"] == 41011
    assert send(emu, access_token=t, msgtype="hologram")["errcode"] == 40008
    assert send(emu, {"touser": "zhangwei", "msgtype": "markdown", "agentid": agent},
                access_token=t)["errcode"] == 40008
    raw = requests.post(emu.url + "/cgi-bin/message/send", params={"access_token": t},
                        data=b"{not json", timeout=5).json()
    assert raw["errcode"] == 47001
    image = send(emu, {"touser": "zhangwei", "msgtype": "image", "agentid": str(agent),
                       "image": {"media_id": "MEDIA"}}, access_token=t)
    assert image["errcode"] == 0
    assert send(emu, {"touser": "zhangwei", "msgtype": "image", "agentid": agent, "image": {}},
                access_token=t)["errcode"] == 40007


def test_duplicate_check_suppresses_repeats_within_the_interval(emu):
    clock = FakeClock()
    emu.state.clock = clock
    t = token(emu)
    dup = {"enable_duplicate_check": 1, "duplicate_check_interval": 60}
    assert send(emu, access_token=t, **dup)["errcode"] == 0
    assert send(emu, access_token=t, **dup)["errcode"] == 0  # answered ok, not delivered again
    assert send(emu, access_token=t, touser="zhangwei|lina", **dup)["errcode"] == 0  # lina is new
    assert send(emu, access_token=t, text={"content": "不同"}, **dup)["errcode"] == 0
    clock.now += 61
    assert send(emu, access_token=t, **dup)["errcode"] == 0  # window over
    assert send(emu, access_token=t)["errcode"] == 0  # check off: always delivered
    got = [(m["touser"], m["content"]) for m in emu.state.messages]
    assert got == [("zhangwei", "你好"), ("lina", "你好"), ("zhangwei", "不同"),
                   ("zhangwei", "你好"), ("zhangwei", "你好")]
    stats = admin(emu, "GET", "stats").json()["apis"]["message/send"]
    assert stats["duplicates_suppressed"] == 2 and stats["errcode"]["0"] == 6


# -- address book -----------------------------------------------------------------------------
def test_user_get_and_department_list(emu):
    t = token(emu)
    user = requests.get(emu.url + "/cgi-bin/user/get", params={"access_token": t, "userid": "ZhangWei"},
                        timeout=5)
    assert user.json()["name"] == "张伟" and user.json()["userid"] == "zhangwei"
    assert "张伟".encode() in user.content  # UTF-8, not \u escapes, like WeCom
    missing = requests.get(emu.url + "/cgi-bin/user/get", params={"access_token": t, "userid": "ghost"},
                           timeout=5).json()
    assert missing["errcode"] == 60111
    depts = requests.get(emu.url + "/cgi-bin/department/list", params={"access_token": t, "id": 2},
                         timeout=5).json()
    assert [d["id"] for d in depts["department"]] == [2, 3]


def test_appchat_lists_only_the_chats_the_app_created(emu):
    t = token(emu)
    made = requests.post(emu.url + "/cgi-bin/appchat/create", params={"access_token": t},
                         json={"chatid": "finance01", "userlist": ["XuLi", "sunhao"]}, timeout=5).json()
    assert made == {"errcode": 0, "errmsg": "ok", "chatid": "finance01"}

    def get(chatid):
        return requests.get(emu.url + "/cgi-bin/appchat/get", params={"access_token": t, "chatid": chatid},
                            timeout=5).json()

    assert get("finance01")["chat_info"] == {"chatid": "finance01", "name": "", "owner": "xuli",
                                             "userlist": ["xuli", "sunhao"]}
    assert admin(emu, "POST", "chats", json={"chatid": "botgroup", "userlist": ["lina", "xuli"],
                                             "by_app": False}).ok
    assert get("botgroup")["errcode"] == 86008 and get("nosuchchat")["errcode"] == 86003
    updated = requests.post(emu.url + "/cgi-bin/appchat/update", params={"access_token": t},
                            json={"chatid": "finance01", "add_user_list": ["lina"],
                                  "del_user_list": ["sunhao"]}, timeout=5).json()
    assert updated["errcode"] == 0 and get("finance01")["chat_info"]["userlist"] == ["xuli", "lina"]
    bad = requests.post(emu.url + "/cgi-bin/appchat/create", params={"access_token": t},
                        json={"userlist": ["xuli", "ghost"]}, timeout=5).json()
    assert bad["errcode"] == 86007
    emu.state.config.aibot_token, emu.state.config.aibot_aes_key = "aibot-token", "a" * 43
    outsider = admin(emu, "POST", "aibot/send", json={"from_user": "sunhao", "content": "hi",
                                                      "chat_type": "group", "chat_id": "finance01"})
    assert outsider.status_code == 400 and "not a member" in outsider.json()["error"]


def test_a_contact_change_updates_the_directory_and_sends_change_contact(receiver_emu):
    emu, receiver = receiver_emu
    answer = admin(emu, "POST", "contact", json={"userid": "huangmin", "department": [5, 7], "wait": True}).json()
    assert answer["user"]["department"] == [5, 7] and answer["callback"]["first_attempt"]["outcome"] == "ok"
    xml = wait_for(lambda: receiver.posts)[-1]["xml"]
    assert (xml.findtext("FromUserName"), xml.findtext("Event"), xml.findtext("ChangeType"),
            xml.findtext("UserID"), xml.findtext("Department")) == (
        "sys", "change_contact", "update_user", "huangmin", "5,7")
    assert xml.find("AgentID") is None
    user = requests.get(emu.url + "/cgi-bin/user/get", params={"access_token": token(emu), "userid": "huangmin"},
                        timeout=5).json()
    assert user["department"] == [5, 7] and user["main_department"] == 5
    assert admin(emu, "POST", "contact", json={"userid": "huangmin", "department": [99]}).status_code == 400
    assert admin(emu, "POST", "contact", json={"userid": "ghost", "department": [5]}).status_code == 404


# -- fault injection --------------------------------------------------------------------------
def test_faults_are_consumed_one_per_call_in_order(emu):
    t = token(emu)
    for fault in ({"errcode": 45009}, {"http_status": 503}, {"errcode": -1}):
        assert admin(emu, "POST", "faults", json={"api": "message/send", **fault}).ok
    assert send(emu, access_token=t)["errcode"] == 45009
    resp = requests.post(emu.url + "/cgi-bin/message/send", params={"access_token": t},
                         json={}, timeout=5)
    assert resp.status_code == 503
    assert send(emu, access_token=t)["errcode"] == -1
    assert send(emu, access_token=t)["errcode"] == 0
    assert len(emu.state.messages) == 1  # failed calls delivered nothing
    stats = admin(emu, "GET", "stats").json()["apis"]["message/send"]
    assert stats["errcode"] == {"45009": 1, "-1": 1, "0": 1} and stats["http_status"] == {"503": 1}


def test_fault_on_gettoken_and_user_get(emu):
    admin(emu, "POST", "faults", json={"api": "gettoken", "errcode": 60020, "count": 2})
    assert gettoken(emu)["errcode"] == 60020
    assert gettoken(emu)["errcode"] == 60020
    t = token(emu)
    admin(emu, "POST", "faults", json={"api": "user/get", "errcode": 42001})
    answer = requests.get(emu.url + "/cgi-bin/user/get", params={"access_token": t, "userid": "lina"},
                          timeout=5).json()
    assert answer["errcode"] == 42001


def test_timeout_fault_outlasts_the_client_then_answers(emu):
    t = token(emu)
    admin(emu, "POST", "faults", json={"api": "message/send", "timeout": 0.6})
    with pytest.raises(requests.Timeout):
        requests.post(emu.url + "/cgi-bin/message/send", params={"access_token": t}, timeout=0.2,
                      json={"touser": "zhangwei", "msgtype": "text", "agentid": 1000002,
                            "text": {"content": "慢"}})
    wait_for(lambda: list(emu.state.messages))  # WeCom did the work although the client gave up
    assert emu.state.messages[0]["content"] == "慢"


def test_fault_admin_validates_and_resets(emu):
    assert admin(emu, "POST", "faults", json={"api": "nope", "errcode": 1}).status_code == 400
    assert admin(emu, "POST", "faults", json={"api": "gettoken"}).status_code == 400
    admin(emu, "POST", "faults", json={"api": "gettoken", "errcode": 40013})
    assert admin(emu, "GET", "faults").json()["faults"]["gettoken"] == [{"errcode": 40013}]
    admin(emu, "POST", "reset")
    assert admin(emu, "GET", "faults").json()["faults"]["gettoken"] == []
    assert gettoken(emu)["errcode"] == 0


# -- callbacks --------------------------------------------------------------------------------
def test_text_callback_reaches_the_app_as_wecom_sends_it(receiver_emu):
    emu, receiver = receiver_emu
    cfg = emu.state.config
    answer = admin(emu, "POST", "send", json={"from_user": "zhangwei", "content": "请假流程是什么？"}).json()
    assert answer["msg_id"] > 2**62 and answer["create_time"] > 1_600_000_000
    wait_for(lambda: receiver.posts)
    post = receiver.posts[0]
    xml, env = post["xml"], post["envelope"]
    assert env.findtext("ToUserName") == cfg.corp_id and env.findtext("AgentID") == str(cfg.agent_id)
    assert set(post["args"]) == {"msg_signature", "timestamp", "nonce"}
    assert post["ua"] == cfg.user_agent and post["content_type"].startswith("text/xml")
    assert xml.findtext("ToUserName") == cfg.corp_id
    assert xml.findtext("FromUserName") == "zhangwei"
    assert xml.findtext("MsgType") == "text"
    assert xml.findtext("Content") == "请假流程是什么？"
    assert xml.findtext("MsgId") == str(answer["msg_id"])
    assert xml.findtext("CreateTime") == str(answer["create_time"])
    assert xml.findtext("AgentID") == str(cfg.agent_id)
    assert "<Content><![CDATA[请假流程是什么？]]></Content>" in post["raw"]
    attempts = wait_for(lambda: admin(emu, "GET", "callbacks").json()["attempts"])
    assert attempts[0]["status_code"] == 200 and attempts[0]["attempt"] == 1
    assert attempts[0]["outcome"] == "ok" and attempts[0]["latency_ms"] >= 0
    time.sleep(0.15)  # no retry after a 200
    assert len(receiver.posts) == 1


def test_event_callback_has_no_msgid(receiver_emu):
    emu, receiver = receiver_emu
    answer = admin(emu, "POST", "send", json={"from_user": "lina", "event": "enter_agent"}).json()
    assert answer["msg_id"] is None
    xml = wait_for(lambda: receiver.posts)[0]["xml"]
    assert xml.findtext("MsgType") == "event" and xml.findtext("Event") == "enter_agent"
    assert xml.findtext("EventKey") == "" and xml.find("MsgId") is None
    admin(emu, "POST", "send", json={"from_user": "lina", "event": "click", "event_key": "HELP"})
    xml = wait_for(lambda: len(receiver.posts) > 1 and receiver.posts)[1]["xml"]
    assert xml.findtext("EventKey") == "HELP"


def test_unanswered_callback_is_retried_with_the_same_msgid(receiver_emu):
    emu, receiver = receiver_emu
    receiver.script = [(500, 0.0), (503, 0.0)]
    answer = admin(emu, "POST", "send", json={"from_user": "zhangwei", "content": "重试"}).json()
    wait_for(lambda: len(receiver.posts) == 3)
    ids = {(p["xml"].findtext("MsgId"), p["xml"].findtext("CreateTime")) for p in receiver.posts}
    assert ids == {(str(answer["msg_id"]), str(answer["create_time"]))}
    assert len({p["args"]["nonce"] + p["args"]["msg_signature"] for p in receiver.posts}) == 3
    info = wait_for(lambda: (d := admin(emu, "GET", "callbacks", params={"msg_id": answer["msg_id"]}).json())
                    ["deliveries"][str(answer["delivery_id"])]["status"] == "delivered" and d)
    assert [(a["attempt"], a["status_code"]) for a in info["attempts"]] == [(1, 500), (2, 503), (3, 200)]


def test_slow_answer_counts_as_unanswered():
    config = EmulatorConfig(retry_interval=0.05, callback_timeout=0.4, retries=3)
    with Receiver(config) as receiver:
        config.callback_url = receiver.url
        receiver.script = [(200, 0.9)]
        with EmulatorServer(config) as emu:
            answer = admin(emu, "POST", "send", json={"from_user": "zhangwei", "content": "慢一点"}).json()
            wait_for(lambda: len(receiver.posts) == 2)
            attempts = wait_for(lambda: len(a := emu.state.select(emu.state.callbacks)) == 2 and a)
            assert [a["outcome"] for a in attempts] == ["timeout", "ok"]
            assert {p["xml"].findtext("MsgId") for p in receiver.posts} == {str(answer["msg_id"])}


def test_callback_gives_up_after_the_retries(receiver_emu):
    emu, receiver = receiver_emu
    receiver.script = [(500, 0.0)] * 10
    answer = admin(emu, "POST", "send", json={"from_user": "zhangwei", "content": "失败"}).json()
    wait_for(lambda: emu.state.deliveries[answer["delivery_id"]]["status"] == "failed")
    assert len(receiver.posts) == 4  # the first try and 3 retries
    assert emu.state.stats["callbacks"]["failed"] == 1


def test_callback_to_an_unreachable_app_is_recorded():
    config = EmulatorConfig(retry_interval=0.01, callback_timeout=0.5, retries=1,
                            callback_url="http://127.0.0.1:9/wecom/callback")
    with EmulatorServer(config) as emu:
        answer = admin(emu, "POST", "send", json={"from_user": "zhangwei", "content": "x", "wait": True}).json()
        assert answer["first_attempt"]["outcome"] == "connection_error"
        wait_for(lambda: emu.state.deliveries[answer["delivery_id"]]["status"] == "failed")


def test_force_retry_delivers_an_answered_callback_twice(receiver_emu):
    emu, receiver = receiver_emu
    answer = admin(emu, "POST", "send", json={"from_user": "zhangwei", "content": "两次",
                                               "force_retry": True}).json()
    wait_for(lambda: emu.state.deliveries[answer["delivery_id"]]["attempts"] == 2)
    assert [p["xml"].findtext("MsgId") for p in receiver.posts] == [str(answer["msg_id"])] * 2
    assert [a["forced"] for a in emu.state.select(emu.state.callbacks)] == [False, True]


def test_passive_reply_is_shown_to_the_user(receiver_emu):
    emu, receiver = receiver_emu
    receiver.reply = "收到，马上处理"
    admin(emu, "POST", "send", json={"from_user": "wangfang", "content": "在吗"})
    msgs = wait_for(lambda: admin(emu, "GET", "messages", params={"touser": "wangfang"}).json()["messages"])
    assert msgs[0]["content"] == "收到，马上处理" and msgs[0]["source"] == "passive_reply"
    convo = admin(emu, "GET", "conversation", params={"userid": "wangfang"}).json()["items"]
    assert [(i["direction"], i["content"]) for i in convo] == [("in", "在吗"), ("out", "收到，马上处理")]


def test_send_rejects_what_wecom_would_never_send(emu):
    assert admin(emu, "POST", "send", json={"from_user": "ghost", "content": "x"}).status_code == 400
    assert admin(emu, "POST", "send", json={"from_user": "lina", "msg_type": "sticker"}).status_code == 400
    assert admin(emu, "POST", "send", json={"from_user": "lina", "event": "dance"}).status_code == 400


def test_callback_xml_escapes_cdata_terminators():
    xml = build_callback_xml("wwcorp", 1, {"from_user": "u", "msg_type": "text", "content": "a]]>b<c"},
                             1700000000, 42)
    assert ElementTree.fromstring(xml).findtext("Content") == "a]]>b<c"
    loc = build_callback_xml("wwcorp", 1, {"from_user": "u", "msg_type": "location", "label": "广州"},
                             1700000000, 43)
    root = ElementTree.fromstring(loc)
    assert root.findtext("Location_X") and root.findtext("Label") == "广州"


# -- URL verification -------------------------------------------------------------------------
def test_url_verification(receiver_emu):
    emu, receiver = receiver_emu
    result = admin(emu, "POST", "verify").json()
    assert result["ok"] and result["echoed"] and result["status_code"] == 200
    receiver.echo_wrong = True
    result = admin(emu, "POST", "verify").json()
    assert not result["ok"] and not result["echoed"]


# -- chat page, settings, CLI -----------------------------------------------------------------
def test_chat_page_renders_the_directory():
    app, _ = create_emulator(EmulatorConfig())
    client = app.test_client()
    page = client.get("/")
    assert page.status_code == 200 and page.mimetype == "text/html"
    html = page.get_data(as_text=True)
    assert '<meta charset="utf-8">' in html and "张伟" in html and 'value="zhangwei"' in html
    assert "进入应用" in html and "/_emulator/static/chat.js" in html
    assert client.get("/_emulator/static/chat.js").status_code == 200
    assert client.get("/_emulator/static/chat.css").status_code == 200


def test_public_config_hides_secrets_and_can_be_changed(emu):
    cfg = admin(emu, "GET", "config").json()
    assert cfg["corp_id"] == emu.state.config.corp_id
    assert emu.state.config.secret not in str(cfg) and emu.state.config.aes_key not in str(cfg)
    changed = admin(emu, "POST", "config", json={"callback_url": "http://127.0.0.1:1/cb", "retries": 1}).json()
    assert changed["callback_url"] == "http://127.0.0.1:1/cb" and changed["retries"] == 1


def test_config_from_env_and_cli_defaults():
    cfg = EmulatorConfig.from_env({"WECOM_CORP_ID": "wwenv", "WECOM_AGENT_ID": "7"}, retries=1)
    assert (cfg.corp_id, cfg.agent_id, cfg.retries) == ("wwenv", 7, 1)
    args = parse_args([])
    assert (args.host, args.port, args.retries, args.retry_interval, args.token_ttl) == \
        ("127.0.0.1", 8081, 3, 5.0, 7200.0)


def test_stored_items_are_capped():
    with EmulatorServer(EmulatorConfig(max_items=3)) as emu:
        t = token(emu)
        for i in range(5):
            send(emu, access_token=t, text={"content": f"第{i}条"})
        assert [m["content"] for m in emu.state.messages] == ["第2条", "第3条", "第4条"]


def test_logs_carry_no_secrets_tokens_or_contents(receiver_emu, caplog):
    emu, receiver = receiver_emu
    caplog.set_level("INFO")
    t = token(emu)
    send(emu, access_token=t, text={"content": "机密内容"})
    admin(emu, "POST", "send", json={"from_user": "zhangwei", "content": "用户的私密问题"})
    wait_for(lambda: receiver.posts)
    wait_for(lambda: "outcome=ok" in caplog.text)
    for secret in (emu.state.config.secret, t, "机密内容", "用户的私密问题", emu.state.config.aes_key):
        assert secret not in caplog.text
    assert "GET /cgi-bin/gettoken" in caplog.text  # the access log is still there, minus the query


@pytest.mark.parametrize("host, environ", [
    ("0.0.0.0", {}), ("::", {}), ("192.168.1.10", {}), ("emulator.example.com", {}),
    ("127.0.0.1", {"WECOM_BOT_PRODUCTION": "1"}),
    ("127.0.0.1", {"WECOM_API_BASE": "https://qyapi.weixin.qq.com"}),
])
def test_the_emulator_refuses_production_looking_settings(host, environ, monkeypatch, capsys):
    from emulator.__main__ import main
    from emulator.config import UnsafeToRun, refuse_production
    from emulator.server import serve

    with pytest.raises(UnsafeToRun):
        refuse_production(host, environ)
    for name in ("WECOM_BOT_PRODUCTION", "WECOM_API_BASE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert main(["--host", host, "--port", "0"]) == 2
    assert "refusing to start" in capsys.readouterr().err
    if not environ:
        with pytest.raises(UnsafeToRun):
            serve(None, host, 0)


@pytest.mark.parametrize("host, environ", [
    ("127.0.0.1", {}), ("localhost", {}), ("::1", {}),
    ("127.0.0.1", {"WECOM_API_BASE": "http://127.0.0.1:8081", "WECOM_BOT_PRODUCTION": "0"}),
])
def test_the_emulator_runs_on_loopback_for_demo_and_tests(host, environ):
    from emulator.config import refuse_production

    refuse_production(host, environ)


# -- template cards: send, click, update_template_card ------------------------------------------
def test_a_template_card_is_clicked_and_updated_once(receiver_emu):
    emu, receiver = receiver_emu
    access_token = token(emu)
    card = {"card_type": "button_interaction", "task_id": "fb-1-abc", "main_title": {"title": "有帮助吗？"},
            "button_list": [{"text": "👍", "key": "feedback_up"}, {"text": "👎", "key": "feedback_down"}]}
    sent = send(emu, {"touser": "zhangwei", "msgtype": "template_card", "agentid": emu.state.config.agent_id,
                      "template_card": card}, access_token=access_token)
    assert sent["errcode"] == 0 and sent["response_code"]
    assert admin(emu, "POST", "card_click", json={"userid": "zhangwei", "task_id": "fb-1-abc",
                                                  "key": "nope"}).status_code == 400
    assert admin(emu, "POST", "card_click", json={"userid": "lisi", "task_id": "fb-1-abc",
                                                  "key": "feedback_up"}).status_code == 404
    assert admin(emu, "POST", "card_click", json={"userid": "zhangwei", "task_id": "fb-1-abc",
                                                  "key": "feedback_up"}).ok
    post = wait_for(lambda: receiver.posts)[0]["xml"]
    assert post.findtext("Event") == "template_card_event" and post.findtext("EventKey") == "feedback_up"
    assert post.findtext("TaskId") == "fb-1-abc" and post.findtext("CardType") == "button_interaction"
    code = post.findtext("ResponseCode")
    assert code and code != sent["response_code"]

    def update(response_code):
        return requests.post(emu.url + "/cgi-bin/message/update_template_card",
                             params={"access_token": access_token}, timeout=5,
                             json={"userids": ["zhangwei"], "agentid": emu.state.config.agent_id,
                                   "response_code": response_code, "button": {"replace_name": "已评价 👍"}}).json()

    assert update(code)["errcode"] == 0
    assert update(code)["errcode"] == 40058  # a response_code works once
    assert update("made-up")["errcode"] == 40058
    [shown] = [m for m in admin(emu, "GET", "messages", params={"touser": "zhangwei"}).json()["messages"]
               if m["msgtype"] == "template_card"]
    assert shown["card_update"] == {"replace_name": "已评价 👍"}
    assert admin(emu, "POST", "card_click", json={"userid": "zhangwei", "task_id": "fb-1-abc",
                                                  "key": "feedback_down"}).status_code == 409


@pytest.mark.parametrize("name", ["WECOM_SECRET", "WECOM_TOKEN", "WECOM_AES_KEY", "AIBOT_TOKEN",
                                  "AIBOT_ENCODING_AES_KEY", "AIBOT_SECRET"])
def test_the_emulator_refuses_any_secret_but_its_own_demo_value(name):
    """With WECOM_API_BASE unset (real WeCom) and a real deployment's secret in the
    environment, the emulator would forge that deployment's callbacks: it does not start."""
    import secrets
    import subprocess
    import sys

    from scripts.dev_env import random_aes_key

    env = {k: v for k, v in os.environ.items() if k not in (
        "WECOM_API_BASE", "WECOM_BOT_PRODUCTION", "WECOM_SECRET", "WECOM_TOKEN", "WECOM_AES_KEY",
        "AIBOT_TOKEN", "AIBOT_ENCODING_AES_KEY", "AIBOT_SECRET")}
    env[name] = random_aes_key() if name.endswith("AES_KEY") else secrets.token_urlsafe(32)
    try:
        done = subprocess.run([sys.executable, "-m", "emulator", "--host", "127.0.0.1", "--port", "0"],
                              env=env, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the emulator started with a foreign {name}")
    assert done.returncode == 2
    assert "refusing to start" in done.stderr and name in done.stderr and env[name] not in done.stderr


def test_make_runs_secrets_are_the_emulators_demo_values():
    from emulator.config import EmulatorConfig, refuse_foreign_secrets
    from scripts.dev_env import dev_env

    refuse_foreign_secrets(EmulatorConfig.from_env(dev_env()))
    refuse_foreign_secrets(EmulatorConfig.from_env({}))  # the AI bot off: no secret at all


def test_department_get_names_the_heads(emu):
    t = token(emu)

    def get(dept_id):
        return requests.get(emu.url + "/cgi-bin/department/get", params={"access_token": t, "id": dept_id},
                            timeout=5).json()

    algorithms = get(3)
    assert algorithms["department"]["department_leader"] == ["wangfang"]  # is_leader_in_dept there
    assert algorithms["department"]["parentid"] == 2 and algorithms["department"]["name"] == "算法组"
    assert get(2)["department"]["department_leader"] == ["zhangwei"]
    assert get(99)["errcode"] == 60123
    emu.state.directory.update_user("wangfang", departments=[4])  # moved: no longer 算法组's head
    assert get(3)["department"]["department_leader"] == []
