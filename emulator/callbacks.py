"""WeCom calling the app: message/event XML, encryption, delivery with WeCom's retries.

A callback is POSTed to ``callback_url?msg_signature=&timestamp=&nonce=`` as
``<xml><ToUserName/><Encrypt/><AgentID/></xml>``. Anything but HTTP 200 within the callback
timeout counts as unanswered and is sent again up to ``retries`` times, ``retry_interval`` seconds
after the previous attempt began: the same plaintext (same MsgId and CreateTime), with a fresh
timestamp, nonce and signature. A 200 whose body is an encrypted passive reply is decrypted and
shown to the user like WeCom does.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

import requests
from defusedxml import ElementTree

from app.wecom.crypto import WeComCrypto, extract_encrypt
from app.wecom.exceptions import WeComCryptoError
from emulator.background import BackgroundThreads
from emulator.state import EmulatorState

log = logging.getLogger("emulator")

MESSAGE_TYPES = ("text", "image", "voice", "video", "location", "link", "file")
EVENTS = ("subscribe", "unsubscribe", "enter_agent", "LOCATION", "click", "view", "template_card_event",
          "change_contact")
CONTACT_CHANGES = ("create_user", "update_user", "delete_user")

_ENVELOPE = ("<xml><ToUserName><![CDATA[{corp}]]></ToUserName><Encrypt><![CDATA[{encrypt}]]>"
             "</Encrypt><AgentID><![CDATA[{agent}]]></AgentID></xml>")


class CallbackError(ValueError):
    """The admin asked for a callback WeCom would never send."""


def cdata(value) -> str:
    # "]]>" cannot appear inside CDATA: close the section, emit it split, reopen.
    return "<![CDATA[" + str(value).replace("]]>", "]]]]><![CDATA[>") + "]]>"


def build_callback_xml(corp_id: str, agent_id: int, spec: dict, create_time: int,
                       msg_id: int | None) -> str:
    """The decrypted callback XML for a message (``msg_type``) or an event (``event``).

    Field names and order follow WeCom's "消息格式" and "事件格式" pages; strings are CDATA,
    numbers (CreateTime, MsgId, AgentID, coordinates) are bare.
    """
    fields: list[tuple[str, object, bool]] = [
        ("ToUserName", corp_id, True), ("FromUserName", spec["from_user"], True),
        ("CreateTime", create_time, False),
    ]
    event = spec.get("event")
    if event:
        fields += [("MsgType", "event", True), ("Event", event, True)]
        if event == "LOCATION":
            fields += [("Latitude", spec.get("latitude", 23.104105), False),
                       ("Longitude", spec.get("longitude", 113.320107), False),
                       ("Precision", spec.get("precision", 65.0), False)]
        elif event == "change_contact":  # the address book changed (from "sys", no AgentID)
            fields += [("ChangeType", spec["change_type"], True), ("UserID", spec["userid"], True)]
            if spec.get("department"):
                fields += [("Department", ",".join(map(str, spec["department"])), True),
                           ("MainDepartment", spec.get("main_department") or spec["department"][0], False)]
            body = "".join(f"<{k}>{cdata(v) if is_text else v}</{k}>" for k, v, is_text in fields)
            return f"<xml>{body}</xml>"
        elif event == "template_card_event":  # a click on a template card's button
            fields += [("EventKey", spec.get("event_key") or "", True),
                       ("TaskId", spec.get("task_id") or "", True),
                       ("CardType", spec.get("card_type") or "button_interaction", True),
                       ("ResponseCode", spec.get("response_code") or "", True)]
            if spec.get("selected"):  # a drop-down's or a vote's choice (模板卡片事件推送)
                items = "".join(
                    f"<SelectedItem><QuestionKey>{cdata(q)}</QuestionKey><OptionIds>"
                    + "".join(f"<OptionId>{cdata(o)}</OptionId>" for o in ids)
                    + "</OptionIds></SelectedItem>" for q, ids in spec["selected"].items())
                fields.append(("SelectedItems", items, False))
        elif event not in ("subscribe", "unsubscribe"):
            fields.append(("EventKey", spec.get("event_key") or "", True))
    else:
        kind = spec.get("msg_type", "text")
        fields.append(("MsgType", kind, True))
        if kind == "text":
            fields.append(("Content", spec.get("content", ""), True))
        elif kind == "image":
            fields += [("PicUrl", spec.get("pic_url", "https://wework.qpic.cn/emulator/0"), True),
                       ("MediaId", spec.get("media_id", "emulator-image"), True)]
        elif kind == "voice":
            fields += [("MediaId", spec.get("media_id", "emulator-voice"), True),
                       ("Format", spec.get("format", "amr"), True)]
        elif kind == "file":  # not on WeCom's 90239 list, but some clients send it: MediaId alone
            fields.append(("MediaId", spec.get("media_id", "emulator-file"), True))
        elif kind == "video":
            fields += [("MediaId", spec.get("media_id", "emulator-media-id"), True),
                       ("ThumbMediaId", spec.get("thumb_media_id", "emulator-thumb-id"), True)]
        elif kind == "location":
            fields += [("Location_X", spec.get("location_x", 23.134521), False),
                       ("Location_Y", spec.get("location_y", 113.358803), False),
                       ("Scale", spec.get("scale", 20), False),
                       ("Label", spec.get("label", ""), True)]
        elif kind == "link":
            fields += [("Title", spec.get("title", ""), True),
                       ("Description", spec.get("description", ""), True),
                       ("Url", spec.get("url", ""), True),
                       ("PicUrl", spec.get("pic_url", ""), True)]
        fields.append(("MsgId", msg_id, False))
    fields.append(("AgentID", agent_id, False))
    body = "".join(f"<{k}>{cdata(v) if is_text else v}</{k}>" for k, v, is_text in fields)
    return f"<xml>{body}</xml>"


def validate_spec(spec: dict, state: EmulatorState) -> dict:
    """Normalise ``POST /_emulator/send``'s body or raise CallbackError."""
    if not isinstance(spec, dict):
        raise CallbackError("body must be a JSON object")
    if spec.get("event") == "change_contact":
        if spec.get("change_type") not in CONTACT_CHANGES or not isinstance(spec.get("userid"), str):
            raise CallbackError(f"change_contact needs change_type ({', '.join(CONTACT_CHANGES)}) "
                                "and userid")
        return dict(spec, from_user="sys")
    user = state.directory.user(spec.get("from_user") or "")
    if user is None:
        raise CallbackError("from_user is not in the directory")
    spec = dict(spec, from_user=user["userid"])
    if spec.get("event"):
        if spec["event"] not in EVENTS:
            raise CallbackError(f"event must be one of {', '.join(EVENTS)}")
    else:
        spec.setdefault("msg_type", "text")
        if spec["msg_type"] not in MESSAGE_TYPES:
            raise CallbackError(f"msg_type must be one of {', '.join(MESSAGE_TYPES)}")
        if spec["msg_type"] == "text" and not isinstance(spec.get("content"), str):
            raise CallbackError("a text message needs a string content")
    return spec


def nonce() -> str:
    return str(1_000_000_000 + secrets.randbelow(9_000_000_000))


class CallbackDeliverer:
    """Sends callbacks on background threads and records every attempt in the state."""

    def __init__(self, state: EmulatorState):
        self.state = state
        self._background = BackgroundThreads("wecom-emulator-callback", "callback delivery")

    def crypto(self) -> WeComCrypto:
        cfg = self.state.config
        return WeComCrypto(cfg.token, cfg.aes_key, cfg.corp_id)

    # -- user messages and events -------------------------------------------------------------
    def send(self, spec: dict, wait: bool = False) -> dict:
        """Record what the user sent, start delivering it, answer msg_id/create_time/delivery_id."""
        st, cfg = self.state, self.state.config
        spec = validate_spec(spec, st)
        create_time = int(spec.get("create_time") or st.wall())
        msg_id = None if spec.get("event") else st.next_msgid()
        xml = build_callback_xml(cfg.corp_id, cfg.agent_id, spec, create_time, msg_id)
        delivery_id = st.next_delivery_id()
        kind = spec.get("event") or spec["msg_type"]
        st.store_inbound({
            "delivery_id": delivery_id, "msg_id": msg_id, "create_time": create_time,
            "from_user": spec["from_user"], "msg_type": "event" if spec.get("event") else kind,
            "event": spec.get("event"), "event_key": spec.get("event_key"),
            "content": spec.get("content"), "time": st.wall(),
        })
        st.open_delivery(delivery_id, {"msg_id": msg_id, "from_user": spec["from_user"], "kind": kind})
        first_done = threading.Event()
        result: dict = {}
        self._start(self._deliver, delivery_id, xml, spec, msg_id, bool(spec.get("force_retry")),
                    first_done, result)
        log.info("callback queued delivery=%d kind=%s", delivery_id, kind)
        answer = {"msg_id": msg_id, "create_time": create_time, "delivery_id": delivery_id}
        if wait:
            first_done.wait(cfg.callback_timeout + 5)
            answer["first_attempt"] = dict(result)
        return answer

    def send_xml(self, xml: str, sender: str, force_retry: bool = False) -> int:
        """Deliver a callback whose plaintext the caller built (``emulator.kf``'s event, which
        names no user), with WeCom's retries; its delivery id. ``sender`` labels the records."""
        delivery_id = self.state.next_delivery_id()
        self.state.open_delivery(delivery_id, {"msg_id": None, "from_user": sender, "kind": "event"})
        self._start(self._deliver, delivery_id, xml, {"from_user": sender}, None, force_retry,
                    threading.Event(), {})
        return delivery_id

    def _start(self, target, *args) -> None:
        self._background.start(target, *args)

    def _deliver(self, delivery_id: int, xml: str, spec: dict, msg_id: int | None,
                 force_retry: bool, first_done: threading.Event, result: dict) -> None:
        st, cfg = self.state, self.state.config
        crypto = self.crypto()
        encrypt = crypto.encrypt(xml)
        envelope = _ENVELOPE.format(corp=cfg.corp_id, encrypt=encrypt, agent=cfg.agent_id)
        attempt, forced, status = 0, False, "failed"
        max_attempts = 1 + max(0, cfg.retries)
        while attempt < max_attempts and not st.stopping.is_set():
            attempt += 1
            started = time.monotonic()
            record = self._attempt(crypto, envelope, encrypt)
            record.update(delivery_id=delivery_id, msg_id=msg_id, attempt=attempt, forced=forced,
                          from_user=spec["from_user"], event=spec.get("event"))
            reply_body = record.pop("_body", None)
            if reply_body is not None and not forced:
                record["reply"] = self._passive_reply(crypto, reply_body, spec)
            st.store_attempt(record)
            st.bump("callbacks", "attempts")
            st.bump("callbacks", f"outcome_{record['outcome']}")
            log.info("callback delivery=%d attempt=%d outcome=%s status=%s latency_ms=%s",
                     delivery_id, attempt, record["outcome"], record["status_code"],
                     record["latency_ms"])
            if attempt == 1:
                result.update(record)
                first_done.set()
            if record["outcome"] == "ok":
                status = "delivered"
                if force_retry and not forced:
                    # Deliver once more although answered: what the app sees when WeCom missed
                    # its 200 (network) and retried; the app must drop it by MsgId.
                    forced, max_attempts = True, attempt + 1
                else:
                    break
            if attempt < max_attempts:
                st.stopping.wait(max(0.0, started + cfg.retry_interval - time.monotonic()))
        st.close_delivery(delivery_id, status)
        st.bump("callbacks", status)
        first_done.set()

    def _attempt(self, crypto: WeComCrypto, envelope: str, encrypt: str) -> dict:
        cfg = self.state.config
        timestamp, nonce_ = str(int(self.state.wall())), nonce()
        params = {"msg_signature": crypto.signature(timestamp, nonce_, encrypt),
                  "timestamp": timestamp, "nonce": nonce_}
        headers = {"User-Agent": cfg.user_agent, "Content-Type": "text/xml",
                   "Accept": "*/*", "Connection": "close"}
        started = time.monotonic()
        record: dict = {"status_code": None, "time": self.state.wall(), "url": cfg.callback_url}
        try:
            resp = requests.post(cfg.callback_url, params=params, data=envelope.encode(),
                                 headers=headers, timeout=cfg.callback_timeout)
        except requests.Timeout:
            record["outcome"] = "timeout"
        except requests.RequestException as exc:
            record.update(outcome="connection_error", error=type(exc).__name__)
        else:
            record["status_code"] = resp.status_code
            record["outcome"] = "ok" if resp.status_code == 200 else "http_error"
            body = resp.content.strip()
            if resp.status_code == 200 and body and body != b"success":
                record["_body"] = body
        record["latency_ms"] = round((time.monotonic() - started) * 1000, 1)
        return record

    def _passive_reply(self, crypto: WeComCrypto, body: bytes, spec: dict) -> str:
        """Show an encrypted passive reply to the user; answer "ok" or why it was dropped."""
        try:
            root = ElementTree.fromstring(body, forbid_dtd=True)
            encrypt = extract_encrypt(body)
            crypto.check_signature(root.findtext("MsgSignature", ""), root.findtext("TimeStamp", ""),
                                   root.findtext("Nonce", ""), encrypt)
            reply = ElementTree.fromstring(crypto.decrypt(encrypt), forbid_dtd=True)
        except (WeComCryptoError, ElementTree.ParseError, ValueError) as exc:
            self.state.bump("callbacks", "passive_reply_invalid")
            return f"invalid: {type(exc).__name__}"
        msgtype = reply.findtext("MsgType", "")
        content = reply.findtext("Content") if msgtype in ("text", "markdown") else None
        self.state.store_message({
            "msgid": None, "touser": spec["from_user"], "msgtype": msgtype or "unknown",
            "agentid": self.state.config.agent_id, "content": content, "payload": {},
            "time": self.state.wall(), "source": "passive_reply",
        })
        self.state.bump("callbacks", "passive_replies")
        return "ok"

    # -- URL verification ---------------------------------------------------------------------
    def verify(self) -> dict:
        """WeCom's "save the callback URL" check: GET with an encrypted echostr, expect plaintext."""
        cfg = self.state.config
        crypto = self.crypto()
        plain = str(10**18 + secrets.randbelow(9 * 10**18))
        echostr = crypto.encrypt(plain)
        timestamp, nonce_ = str(int(self.state.wall())), nonce()
        params = {"msg_signature": crypto.signature(timestamp, nonce_, echostr),
                  "timestamp": timestamp, "nonce": nonce_, "echostr": echostr}
        started = time.monotonic()
        outcome: dict = {"ok": False, "status_code": None, "echoed": False, "url": cfg.callback_url}
        try:
            resp = requests.get(cfg.callback_url, params=params, timeout=cfg.callback_timeout,
                                headers={"User-Agent": cfg.user_agent, "Connection": "close"})
        except requests.RequestException as exc:
            outcome["error"] = type(exc).__name__
        else:
            outcome["status_code"] = resp.status_code
            outcome["echoed"] = resp.text.strip() == plain
            outcome["ok"] = resp.status_code == 200 and outcome["echoed"]
        outcome["latency_ms"] = round((time.monotonic() - started) * 1000, 1)
        self.state.bump("verify", "ok" if outcome["ok"] else "failed")
        log.info("url verification ok=%s status=%s", outcome["ok"], outcome["status_code"])
        return outcome

    # -- shutdown -----------------------------------------------------------------------------
    def join(self, timeout: float = 5.0) -> None:
        self._background.join(timeout)
