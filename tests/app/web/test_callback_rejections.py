"""Bad callbacks get the right status with a short JSON reason, and nothing is queued."""

import time

import pytest
import requests

from app.wecom.crypto import WeComCrypto
from tests.support.callbacks import CallbackForger

pytestmark = pytest.mark.integration


@pytest.fixture
def forge(stack):
    return Forger(stack)


class Forger(CallbackForger):
    def __init__(self, stack):
        super().__init__(stack.env)
        self.stack = stack

    def post(self, plaintext: str, **kwargs):
        params, body = self.request(plaintext, **kwargs)
        return requests.post(self.stack.callback_url, data=body, params=params, timeout=10)


def assert_rejected(stack, response, status, words):
    assert response.status_code == status, response.text
    assert words in response.json()["error"]


@pytest.fixture
def rows_unchanged(stack):
    before = len(stack.outbox_rows())
    yield
    time.sleep(0.3)
    assert len(stack.outbox_rows()) == before


def test_valid_forged_message_is_accepted_as_control(stack, forge):
    """The forger itself is right: an honest message through it is accepted (200)."""
    assert forge.post(forge.message_xml("control")).status_code == 200


def test_forged_signature(stack, forge, rows_unchanged):
    assert_rejected(stack, forge.post(forge.message_xml(), signature="0" * 40), 403, "signature")


def test_replayed_old_timestamp(stack, forge, rows_unchanged):
    assert_rejected(stack, forge.post(forge.message_xml(), timestamp=int(time.time()) - 3600), 403, "window")


def test_future_timestamp(stack, forge, rows_unchanged):
    assert_rejected(stack, forge.post(forge.message_xml(), timestamp=int(time.time()) + 3600), 403, "window")


def test_wrong_corpid(stack, forge, rows_unchanged):
    other = WeComCrypto(stack.env["WECOM_TOKEN"], stack.env["WECOM_AES_KEY"], "ww_not_our_corp")
    assert_rejected(stack, forge.post(forge.message_xml(), crypto=other), 403, "CorpID")


def test_malformed_envelope(stack, forge, rows_unchanged):
    assert_rejected(stack, forge.post("x", envelope="<xml><Encrypt>unterminated"), 400, "malformed")


def test_malformed_inner_xml(stack, forge, rows_unchanged):
    assert_rejected(stack, forge.post("<xml><MsgType>text</MsgType"), 400, "malformed")


def test_xml_bomb_inside(stack, forge, rows_unchanged):
    bomb = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
            '<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">'
            '<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>'
            '<xml><ToUserName>x</ToUserName><FromUserName>u</FromUserName><CreateTime>1</CreateTime>'
            '<MsgType>text</MsgType><Content>&lol3;</Content><MsgId>1</MsgId></xml>')
    assert_rejected(stack, forge.post(bomb), 400, "malformed")


def test_xxe_in_envelope(stack, forge, rows_unchanged):
    xxe = ('<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
           '<xml><Encrypt>&e;</Encrypt></xml>')
    assert_rejected(stack, forge.post("x", envelope=xxe), 400, "malformed")


def test_oversized_body(stack, forge, rows_unchanged):
    big = "<xml><Encrypt>" + "A" * (70 * 1024) + "</Encrypt></xml>"
    assert_rejected(stack, forge.post("x", envelope=big), 413, "too large")


def test_missing_query_parameters(stack, rows_unchanged):
    response = requests.post(stack.callback_url, data=b"<xml/>", timeout=10)
    assert_rejected(stack, response, 400, "missing")


def test_another_agent(stack, forge, rows_unchanged):
    xml = forge.message_xml().replace(f"<AgentID>{forge.agent}</AgentID>", "<AgentID>999</AgentID>")
    assert_rejected(stack, forge.post(xml), 403, "agent")


def test_bad_verification_get(stack):
    response = requests.get(stack.callback_url, params={"msg_signature": "0" * 40, "timestamp": "1",
                                                        "nonce": "n", "echostr": "abc"}, timeout=10)
    assert response.status_code in (400, 403)
    assert "error" in response.json()
