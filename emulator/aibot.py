"""The 智能机器人 (AI bot) calling the app, as WeCom does it: JSON callbacks and stream polling.

A message is JSON (``msgid``, ``aibotid``, ``chattype``, ``chatid`` in groups, ``from.userid``,
``response_url``, ``msgtype: text``), encrypted with receive id "" under the bot's own token and
key, and POSTed as ``{"encrypt": ...}`` to ``aibot_callback_url?msg_signature=&timestamp=&nonce=``.
The app answers with an encrypted ``stream`` reply; while it is not finished the bot POSTs a
refresh callback (``msgtype: stream``, ``stream.id``) every ``aibot_poll_interval`` seconds and
shows each reply's content as the whole answer so far, until ``finish`` or 6 minutes after the
stream began (WeCom's errcode 846608: the stream expired). The final text is stored as a bot
message (``source: "aibot_stream"``), every refresh in the conversation record.

Feedback: as WeCom, only a reply whose *first* stream reply carried ``stream.feedback.id`` (a
string of at most 256 UTF-8 bytes) can be rated, once it finished; the id is kept as the
conversation's ``feedback_id`` (a ``feedback`` on a later reply is ignored and counted as
``late_feedback``). ``rate`` sends the ``feedback_event`` callback (``type`` 1 accurate, 2
inaccurate with ``inaccurate_reason_list`` and ``content``, 3 withdrawn) and records it in the
conversation's ``ratings``; the long connection sends it as an ``aibot_event_callback`` frame.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time

import requests
from flask import has_request_context, request

from app.wecom.aibot import decrypt_reply
from app.wecom.crypto import WeComCrypto
from app.wecom.exceptions import WeComCryptoError
from emulator.background import BackgroundThreads
from emulator.callbacks import CallbackError, nonce
from emulator.state import EmulatorState

log = logging.getLogger("emulator")
STREAM_EXPIRED = 846608
#: What a user can send the bot: ``voice`` carries WeCom's transcript (``content``); ``image``
#: and ``file`` an emulator media id (``media_id``; the samples by default), served encrypted;
#: ``mixed`` the text and ``media_ids`` images, text first.
MSGTYPES = ("text", "voice", "image", "file", "mixed")


def _content(kind: str, content: str | None, spec: dict) -> dict:
    url = AibotDeliverer._media_url
    if kind == "text":
        return {"text": {"content": content}}
    if kind == "voice":
        return {"voice": {"content": content}}
    if kind == "image":
        return {"image": {"url": url(spec.get("media_id") or "emulator-image")}}
    if kind == "file":
        return {"file": {"url": url(spec.get("media_id") or "emulator-file")}}
    items = [{"msgtype": "text", "text": {"content": content}}] if content else []
    items += [{"msgtype": "image", "image": {"url": url(m)}} for m in spec.get("media_ids") or ["emulator-image"]]
    return {"mixed": {"msg_item": items}}


def summary(body: dict) -> str:
    """A message's text for the emulator's record: its text, or what it carried."""
    kind = body.get("msgtype")
    if kind in ("text", "voice"):
        return body[kind]["content"]
    if kind == "mixed":
        return " ".join(i["text"]["content"] if i["msgtype"] == "text" else "[image]"
                        for i in body["mixed"]["msg_item"])
    return f"[{kind}]"


class NotRatable(CallbackError):
    """WeCom shows no 👍/👎 under this reply (no feedback.id in its first reply, not finished)."""

    status = 409


class NoSuchReply(CallbackError):
    status = 404


FEEDBACK_TYPES = (1, 2, 3)  # accurate, inaccurate, withdrawn
FEEDBACK_REASONS = (1, 2, 3, 4)  # 与问题无关, 内容不完整, 内容有错误, 数据分析错误


def feedback_of(stream: dict) -> str | None:
    """A reply's ``stream.feedback.id`` when it is one WeCom accepts, else None."""
    fb = stream.get("feedback")
    fid = fb.get("id") if isinstance(fb, dict) else None
    if isinstance(fid, str) and fid and len(fid.encode()) <= 256:
        return fid
    return None


def feedback_event(state: EmulatorState, record: dict, spec: dict) -> dict:
    """The ``feedback_event`` a user's 👍/👎 on ``record``'s reply makes (``CallbackError`` when
    WeCom would show no thumbs under it, or the rating is not one WeCom's UI can give)."""
    if not isinstance(spec, dict):
        raise CallbackError("body must be a JSON object")
    if not record.get("feedback_id"):
        raise NotRatable("this reply carried no feedback.id in its first stream reply: "
                         "WeCom shows no 👍/👎 under it")
    if record.get("status") != "finished":
        raise NotRatable("the reply has not finished")
    kind = spec.get("type")
    if type(kind) is not int or kind not in FEEDBACK_TYPES:
        raise CallbackError("type must be 1 (accurate), 2 (inaccurate) or 3 (withdrawn)")
    reasons, content = spec.get("reasons") or [], spec.get("content")
    if not isinstance(reasons, list) or any(type(r) is not int or r not in FEEDBACK_REASONS for r in reasons):
        raise CallbackError("reasons must be a list of codes 1-4")
    if content is not None and not isinstance(content, str):
        raise CallbackError("content must be a string")
    if kind != 2 and (reasons or content):
        raise CallbackError("reasons and content come with type 2 (inaccurate) only")
    rater = state.directory.user(spec.get("from_user") or record["from_user"])
    if rater is None:
        raise CallbackError("from_user is not in the directory")
    event = {"id": record["feedback_id"], "type": kind}
    if kind == 2:
        event["inaccurate_reason_list"] = reasons
        if content:
            event["content"] = content
    body = {"msgid": str(spec.get("msg_id") or secrets.token_hex(16)), "create_time": int(state.wall()),
            "aibotid": state.config.aibot_id, "chattype": record.get("chat_type") or "single",
            "from": {"userid": rater["userid"]}, "msgtype": "event",
            "event": {"eventtype": "feedback_event", "feedback_event": event}}
    if body["chattype"] == "group":
        body["chatid"] = record.get("chat_id") or ""
    return body


class AibotDeliverer:
    def __init__(self, state: EmulatorState):
        self.state = state
        self.long_connection = None  # emulator.aibot_ws.LongConnection, when there is one
        self._background = BackgroundThreads("wecom-emulator-aibot", "aibot conversation")

    @property
    def enabled(self) -> bool:
        cfg = self.state.config
        return bool(cfg.aibot_token and cfg.aibot_aes_key)

    def crypto(self) -> WeComCrypto:
        cfg = self.state.config
        return WeComCrypto(cfg.aibot_token, cfg.aibot_aes_key, "")

    # -- a user writes to the bot -------------------------------------------------------------
    def send(self, spec: dict, wait: float = 0.0) -> dict:
        """Start one conversation turn; answer its ids (and, with ``wait``, how it ended)."""
        st, cfg = self.state, self.state.config
        if not self.enabled:
            raise CallbackError("the AI bot is not configured (AIBOT_TOKEN, AIBOT_ENCODING_AES_KEY)")
        body, info = self._message(spec)
        delivery_id = st.next_delivery_id()
        st.store_inbound({"delivery_id": delivery_id, "msg_id": body["msgid"], "channel": "aibot",
                          "from_user": info["from_user"], "chat_id": info["chat_id"],
                          "msg_type": body["msgtype"], "content": summary(body), "time": st.wall()})
        with st.lock:
            st.aibot[delivery_id] = dict(info, delivery_id=delivery_id, msg_id=body["msgid"],
                                         stream_id=None, status="pending", refreshes=[],
                                         final=None, error=None)
            while len(st.aibot) > cfg.max_items:
                st.aibot.popitem(last=False)
        done = threading.Event()
        self._start(self._converse, delivery_id, body, done)
        answer = {"msg_id": body["msgid"], "delivery_id": delivery_id}
        if wait:
            done.wait(min(float(wait), cfg.aibot_stream_expiry + 30))
            answer["conversation"] = self.conversation(delivery_id)
        return answer

    def _message(self, spec: dict) -> tuple[dict, dict]:
        st, cfg = self.state, self.state.config
        if not isinstance(spec, dict):
            raise CallbackError("body must be a JSON object")
        user = st.directory.user(spec.get("from_user") or "")
        if user is None:
            raise CallbackError("from_user is not in the directory")
        kind = spec.get("msg_type") or "text"
        if kind not in MSGTYPES:
            raise CallbackError(f"msg_type must be one of {', '.join(MSGTYPES)}")
        content = spec.get("content")
        if kind in ("text", "voice") and (not isinstance(content, str) or not content):
            raise CallbackError("content must be a non-empty string")
        if content is not None and not isinstance(content, str):
            raise CallbackError("content must be a string")
        chat_type = spec.get("chat_type") or "single"
        if chat_type not in ("single", "group"):
            raise CallbackError("chat_type must be single or group")
        chat_id = str(spec.get("chat_id") or ("wr-emulator-group" if chat_type == "group" else ""))
        if chat_type == "group" and st.chats.is_member(chat_id, user["userid"]) is False:
            raise CallbackError("from_user is not a member of this group chat")  # a chat set up here
        if chat_type == "group" and spec.get("mention", True) and kind in ("text", "mixed"):
            content = f"@{cfg.aibot_name} {content or ''}"
        msg_id = str(spec.get("msg_id") or secrets.token_hex(16))
        body = {"msgid": msg_id, "aibotid": cfg.aibot_id, "chattype": chat_type,
                "from": {"userid": user["userid"]}, "response_url": self._response_url(msg_id),
                "msgtype": kind, **_content(kind, content, spec)}
        if chat_type == "group":
            body["chatid"] = chat_id
        return body, {"from_user": user["userid"], "chat_type": chat_type, "chat_id": chat_id}

    @staticmethod
    def _media_url(media_id: str) -> str:
        """Where WeCom's bot would put an image or file: here, encrypted (``media.aibot_media``)."""
        base = request.host_url.rstrip("/") if has_request_context() else "http://127.0.0.1"
        return f"{base}/_emulator/aibot/media/{media_id}"

    def _response_url(self, msg_id: str) -> str:
        return f"https://qyapi.weixin.qq.com/cgi-bin/aibot/response?response_code={msg_id}"

    # -- the conversation: the message, then polling its stream ------------------------------
    def _converse(self, delivery_id: int, body: dict, done: threading.Event) -> None:
        st, cfg = self.state, self.state.config
        try:
            reply = self._post(body, delivery_id, "message")
            if reply is None or reply.get("msgtype") != "stream":
                self._end(delivery_id, "no_reply" if reply is None else "replied", reply=reply)
                return
            stream_id = reply["stream"]["id"]
            began = time.monotonic()
            self._update(delivery_id, stream_id=stream_id, status="streaming")
            while not reply["stream"].get("finish"):
                if time.monotonic() - began >= cfg.aibot_stream_expiry:
                    self._end(delivery_id, "expired", error=STREAM_EXPIRED)
                    return
                if st.stopping.wait(cfg.aibot_poll_interval):
                    self._end(delivery_id, "stopped")
                    return
                refresh = {"msgid": secrets.token_hex(16), "aibotid": cfg.aibot_id,
                           "chattype": body["chattype"], "from": body["from"],
                           "msgtype": "stream", "stream": {"id": stream_id}}
                if "chatid" in body:
                    refresh["chatid"] = body["chatid"]
                reply = self._post(refresh, delivery_id, "refresh")
                if reply is None or reply.get("msgtype") != "stream":
                    self._end(delivery_id, "error", error="refresh answered without a stream")
                    return
            self._end(delivery_id, "finished", final=reply["stream"].get("content", ""))
        except _Unanswered as exc:
            self._end(delivery_id, "error", error=str(exc))
        finally:
            done.set()

    def _post(self, message: dict, delivery_id: int, kind: str) -> dict | None:
        """One encrypted callback; the decrypted reply, None for an empty 200."""
        cfg = self.state.config
        crypto = self.crypto()
        encrypt = crypto.encrypt(json.dumps(message, ensure_ascii=False))
        timestamp, nonce_ = str(int(self.state.wall())), nonce()
        params = {"msg_signature": crypto.signature(timestamp, nonce_, encrypt),
                  "timestamp": timestamp, "nonce": nonce_}
        started = time.monotonic()
        try:
            resp = requests.post(cfg.aibot_callback_url, params=params,
                                 data=json.dumps({"encrypt": encrypt}), timeout=cfg.callback_timeout,
                                 headers={"Content-Type": "application/json",
                                          "User-Agent": cfg.user_agent})
        except requests.RequestException as exc:
            raise _Unanswered(f"{kind}: {type(exc).__name__}") from None
        latency_ms = round((time.monotonic() - started) * 1000, 1)
        self.state.bump("aibot", f"{kind}_{resp.status_code}")
        if resp.status_code != 200:
            raise _Unanswered(f"{kind}: HTTP {resp.status_code}")
        if not resp.content.strip():
            return None
        try:
            reply = decrypt_reply(crypto, resp.content)
        except (WeComCryptoError, ValueError, KeyError, TypeError) as exc:
            raise _Unanswered(f"{kind}: invalid reply ({type(exc).__name__})") from None
        if kind == "refresh" or reply.get("msgtype") == "stream":
            stream = reply.get("stream") or {}
            with self.state.lock:
                record = self.state.aibot[delivery_id]
                if stream.get("feedback") is not None:
                    if kind == "message" and not record["refreshes"] and feedback_of(stream):
                        record["feedback_id"] = feedback_of(stream)
                    else:  # WeCom reads it from the first reply only
                        self.state.bump("aibot", "late_feedback" if feedback_of(stream) else "bad_feedback")
                self.state.aibot[delivery_id]["refreshes"].append({
                    "kind": kind, "content": stream.get("content", ""),
                    "finish": bool(stream.get("finish")), "stream_id": stream.get("id"),
                    "latency_ms": latency_ms})
        return reply

    def _update(self, delivery_id: int, **changes) -> None:
        with self.state.lock:
            self.state.aibot[delivery_id].update(changes)

    def _end(self, delivery_id: int, status: str, final: str | None = None, reply: dict | None = None,
             error=None) -> None:
        st = self.state
        with st.lock:
            record = st.aibot[delivery_id]
            record.update(status=status, final=final, error=error)
        if final is not None or reply is not None:
            content = final if final is not None else (reply.get("text") or {}).get("content")
            st.store_message({"msgid": None, "touser": record["from_user"], "chat_id": record["chat_id"],
                              "msgtype": "stream" if final is not None else reply.get("msgtype"),
                              "content": content, "payload": {}, "agentid": None, "time": st.wall(),
                              "source": "aibot_stream", "delivery_id": delivery_id,
                              "stream_id": record["stream_id"], "feedback_id": record.get("feedback_id")})
        st.bump("aibot", status)
        log.info("aibot conversation delivery=%d status=%s refreshes=%d", delivery_id, status,
                 len(record["refreshes"]))

    def conversation(self, delivery_id: int) -> dict | None:
        with self.state.lock:
            record = self.state.aibot.get(delivery_id)
            return json.loads(json.dumps(record, default=str)) if record is not None else None

    # -- feedback on a reply ------------------------------------------------------------------
    def rate(self, delivery_id: int, spec: dict) -> dict:
        """A user's 👍/👎 (or its withdrawal) on a finished reply that carried ``feedback.id``:
        the ``feedback_event`` callback, or over the long connection for a reply it carried."""
        st = self.state
        with st.lock:
            record = st.aibot.get(delivery_id)
            record = json.loads(json.dumps(record, default=str)) if record is not None else None
        if record is None or record.get("event"):
            raise NoSuchReply("no such AI bot reply")
        body = feedback_event(st, record, spec)
        entry = {"msg_id": body["msgid"], "type": body["event"]["feedback_event"]["type"],
                 "from_user": body["from"]["userid"], "time": st.wall()}
        if record.get("mode") == "ws":
            if self.long_connection is None:
                raise CallbackError("the AI bot's long connection is not running")
            self.long_connection.send_event(body)
            entry["status"] = "sent"
        else:
            try:
                self._post(body, delivery_id, "feedback")
                entry["status"] = "sent"
            except _Unanswered as exc:
                entry.update(status="error", error=str(exc))
        with st.lock:
            st.aibot[delivery_id].setdefault("ratings", []).append(entry)
        st.bump("aibot", "feedback_" + entry["status"])
        log.info("aibot feedback delivery=%d type=%s status=%s", delivery_id, entry["type"], entry["status"])
        return entry

    def conversations(self) -> list[dict]:
        with self.state.lock:
            return json.loads(json.dumps(list(self.state.aibot.values())))

    # -- URL verification ---------------------------------------------------------------------
    def verify(self) -> dict:
        cfg = self.state.config
        if not self.enabled:
            raise CallbackError("the AI bot is not configured (AIBOT_TOKEN, AIBOT_ENCODING_AES_KEY)")
        crypto = self.crypto()
        plain = str(10**18 + secrets.randbelow(9 * 10**18))
        echostr = crypto.encrypt(plain)
        timestamp, nonce_ = str(int(self.state.wall())), nonce()
        params = {"msg_signature": crypto.signature(timestamp, nonce_, echostr),
                  "timestamp": timestamp, "nonce": nonce_, "echostr": echostr}
        try:
            resp = requests.get(cfg.aibot_callback_url, params=params, timeout=cfg.callback_timeout)
        except requests.RequestException as exc:
            return {"ok": False, "status_code": None, "error": type(exc).__name__}
        echoed = resp.text.strip() == plain
        return {"ok": resp.status_code == 200 and echoed, "status_code": resp.status_code,
                "echoed": echoed, "url": cfg.aibot_callback_url}

    # -- threads ------------------------------------------------------------------------------
    def _start(self, target, *args) -> None:
        self._background.start(target, *args)

    def join(self, timeout: float = 5.0) -> None:
        self._background.join(timeout)


class _Unanswered(Exception):
    """The app did not answer a callback with a readable 200."""
