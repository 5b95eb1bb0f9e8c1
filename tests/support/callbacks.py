"""Build WeCom callbacks by hand (signed and encrypted as WeCom does), for tests that bypass the emulator."""

from __future__ import annotations

import time

from app.wecom.crypto import WeComCrypto


def text_message_xml(corp: str, agent, content: str = "hi", user: str = "zhangwei", msg_id=None) -> str:
    """A text message's plaintext XML, as WeCom encrypts it into a callback."""
    return (f"<xml><ToUserName><![CDATA[{corp}]]></ToUserName><FromUserName><![CDATA[{user}]]>"
            f"</FromUserName><CreateTime>{int(time.time())}</CreateTime><MsgType><![CDATA[text]]></MsgType>"
            f"<Content><![CDATA[{content}]]></Content><MsgId>{msg_id or time.time_ns()}</MsgId>"
            f"<AgentID>{agent}</AgentID></xml>")


class CallbackForger:
    def __init__(self, env: dict[str, str]):
        self.crypto = WeComCrypto(env["WECOM_TOKEN"], env["WECOM_AES_KEY"], env["WECOM_CORP_ID"])
        self.corp, self.agent = env["WECOM_CORP_ID"], env["WECOM_AGENT_ID"]

    def message_xml(self, content="hi", user="zhangwei", msg_id=None) -> str:
        return text_message_xml(self.corp, self.agent, content, user, msg_id)

    def request(self, plaintext: str, *, crypto=None, timestamp=None, signature=None, envelope=None):
        """(query params, body bytes) of a callback POST."""
        crypto = crypto or self.crypto
        timestamp = str(timestamp if timestamp is not None else int(time.time()))
        nonce = "n0nce"
        encrypt = crypto.encrypt(plaintext)
        sig = signature or crypto.signature(timestamp, nonce, encrypt)
        body = envelope or (f"<xml><ToUserName><![CDATA[{self.corp}]]></ToUserName>"
                            f"<Encrypt><![CDATA[{encrypt}]]></Encrypt></xml>")
        return {"msg_signature": sig, "timestamp": timestamp, "nonce": nonce}, body.encode()
