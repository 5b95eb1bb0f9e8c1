"""The emulator's 微信客服: the event as WeCom sends it, sync_msg's cursors, send_msg's and
service_state's rules."""

from __future__ import annotations

import pytest
import requests

from app.wecom.messages import KfEvent, parse_message
from emulator import EmulatorConfig, EmulatorServer
from emulator.kf import DEFAULT_ACCOUNT, TOKEN_TTL_S
from tests.emulator.test_emulator import FAST, Receiver, wait_for


@pytest.fixture
def kf_emu():
    config = EmulatorConfig(**FAST)
    with Receiver(config) as receiver:
        config.callback_url = receiver.url
        with EmulatorServer(config) as server:
            token = requests.get(f"{server.url}/cgi-bin/gettoken", timeout=5, params={
                "corpid": config.corp_id, "corpsecret": config.secret}).json()["access_token"]

            def call(api: str, body: dict) -> dict:
                return requests.post(f"{server.url}/cgi-bin/kf/{api}", params={"access_token": token},
                                     json={"open_kfid": DEFAULT_ACCOUNT, **body}, timeout=5).json()

            yield server, receiver, call


def say(server, customer: str, content: str, **extra) -> dict:
    return requests.post(f"{server.url}/_emulator/kf/send", timeout=5,
                         json={"external_userid": customer, "content": content, **extra}).json()


def test_the_event_names_no_user_and_the_app_parses_it(kf_emu):
    server, receiver, _ = kf_emu
    written = say(server, "wmA", "你好")
    wait_for(lambda: receiver.posts)
    event = parse_message(receiver.posts[0]["raw"])
    assert isinstance(event, KfEvent)
    assert event.token == written["token"] and event.open_kfid == DEFAULT_ACCOUNT
    assert receiver.posts[0]["xml"].find("FromUserName") is None


def test_sync_pages_from_a_cursor_and_a_cursor_always_gives_the_same_page(kf_emu):
    server, _, call = kf_emu
    token = [say(server, "wmA", f"问题{n}")["token"] for n in range(3)][-1]
    first = call("sync_msg", {"token": token, "limit": 2})
    assert first["errcode"] == 0 and first["has_more"] == 1
    assert [m["text"]["content"] for m in first["msg_list"]] == ["问题0", "问题1"]
    assert first["msg_list"][0]["origin"] == 3 and first["msg_list"][0]["external_userid"] == "wmA"
    again = call("sync_msg", {"token": token, "limit": 2})
    assert again["msg_list"] == first["msg_list"]
    rest = call("sync_msg", {"cursor": first["next_cursor"], "limit": 2})  # no token: allowed
    assert [m["text"]["content"] for m in rest["msg_list"]] == ["问题2"] and rest["has_more"] == 0
    assert call("sync_msg", {"token": "ENCforged"})["errcode"] == 95007


def test_a_callback_token_expires_after_ten_minutes(kf_emu):
    server, _, call = kf_emu
    kf = server.app.extensions["wecom_emulator_kf"]
    token = say(server, "wmA", "你好")["token"]
    wall = kf.wall
    kf.wall = lambda: wall() + TOKEN_TTL_S + 1
    assert call("sync_msg", {"token": token})["errcode"] == 95007


def test_send_msg_window_and_session_states(kf_emu):
    server, _, call = kf_emu
    kf = server.app.extensions["wecom_emulator_kf"]
    say(server, "wmB", "你好", send_time=int(kf.wall()) - 49 * 3600)

    def send(msgid: str) -> int:
        return call("send_msg", {"touser": "wmB", "msgid": msgid, "msgtype": "text",
                                 "text": {"content": "答"}})["errcode"]

    assert send("late") == 95001  # 49 hours after the customer's message
    say(server, "wmB", "还在吗")
    assert send("m1") == 0 and send("m1") == 95017
    state = call("service_state/get", {"external_userid": "wmB"})
    assert state["service_state"] == 1  # the bot serves them since its message
    assert call("service_state/trans", {"external_userid": "wmB", "service_state": 3})["errcode"] == 95016
    assert call("service_state/trans", {"external_userid": "wmB", "service_state": 3,
                                        "servicer_userid": "zhangsan"})["errcode"] == 0
    assert send("m2") == 95018  # a person serves them: the API may not write
    assert call("service_state/trans", {"external_userid": "wmB", "service_state": 1})["errcode"] == 95016
    requests.post(f"{server.url}/_emulator/kf/end", json={"external_userid": "wmB"}, timeout=5)
    say(server, "wmB", "再问")
    assert call("service_state/get", {"external_userid": "wmB"})["service_state"] == 0
    assert send("m3") == 0
    assert call("send_msg", {"open_kfid": "wkUnknown", "touser": "wmB", "msgtype": "text",
                             "text": {"content": "x"}})["errcode"] == 95000


def test_the_customer_page_is_served(kf_emu):
    server, _, _ = kf_emu
    page = requests.get(f"{server.url}/kf/", timeout=5)
    assert page.status_code == 200 and "/_emulator/kf/send" in page.text
