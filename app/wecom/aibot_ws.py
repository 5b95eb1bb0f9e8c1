"""The AI bot's long connection (智能机器人 长连接): its frames, heartbeat and reconnect backoff.

The bot dials out to WeCom over a WebSocket (``wss://openws.work.weixin.qq.com``): no public
URL, no trusted IPs, no signature or AES (TLS carries it). Every frame is one JSON text message
``{"cmd", "headers": {"req_id"}, "body"}``:

* bot -> WeCom ``aibot_subscribe`` ``{bot_id, secret}`` first, answered by an ack
  ``{"headers": {"req_id"}, "errcode": 0, "errmsg": "ok"}`` (errcode non-zero: refused);
* bot -> WeCom ``ping`` (no body) every 30 s or so, acked the same way; two unanswered pings
  mean the connection is dead;
* WeCom -> bot ``aibot_msg_callback``: the body is the callback mode's decrypted JSON
  (``msgid``, ``aibotid``, ``chattype``, ``chatid``, ``from.userid``, ``msgtype``, ``text``...);
  ``aibot_event_callback``: ``msgtype: event`` with ``event.eventtype`` (``enter_chat``,
  ``disconnected_event`` when a newer connection of the same bot replaced this one, ...);
* bot -> WeCom ``aibot_respond_msg`` with the callback's own ``req_id``: a ``stream`` body
  ``{id, finish, content}``, sent again with the whole text so far until ``finish`` (no refresh
  polling: the bot pushes), each acked; ``aibot_respond_welcome_msg`` answers ``enter_chat``
  (within 5 s) with a ``text`` body; ``aibot_send_msg`` pushes unprompted. A req_id's first
  stream frame may carry ``stream.feedback.id``: a 👍/👎 on that reply then comes back as an
  ``aibot_event_callback`` with ``event.eventtype: feedback_event`` (``app.feedback.ratings``);
* bot -> WeCom ``aibot_upload_media_init`` ``{type, filename, total_size, total_chunks, md5}``
  (acked with ``body.upload_id``), ``aibot_upload_media_chunk`` ``{upload_id, chunk_index,
  base64_data}`` (512 KiB pieces, at most 100), ``aibot_upload_media_finish`` ``{upload_id}``
  (acked with ``body.media_id``): a temporary image or file, sent with ``aibot_send_msg``
  ``{chatid, msgtype: image|file, <type>: {media_id}}`` (``app.aibot.uploads``).

Acks carry the req_id of the frame they answer and no ``cmd``. This module builds and parses;
``app.web.aibot_connection`` holds the connection.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import secrets
import time
from dataclasses import dataclass

DEFAULT_URL = "wss://openws.work.weixin.qq.com"
SUBSCRIBE = "aibot_subscribe"
PING = "ping"
MSG_CALLBACK = "aibot_msg_callback"
EVENT_CALLBACK = "aibot_event_callback"
RESPOND = "aibot_respond_msg"
RESPOND_WELCOME = "aibot_respond_welcome_msg"
SEND = "aibot_send_msg"
UPLOAD_INIT = "aibot_upload_media_init"
UPLOAD_CHUNK = "aibot_upload_media_chunk"
UPLOAD_FINISH = "aibot_upload_media_finish"
UPLOAD_CHUNK_BYTES = 512 * 1024  # the SDKs' piece (base64 of it stays under MAX_FRAME_BYTES)
MAX_UPLOAD_CHUNKS = 100
MEDIA_TYPES = ("image", "file")  # what the bot sends back here (voice and video exist too)
DISCONNECTED_EVENT = "disconnected_event"
MAX_FRAME_BYTES = 1024 * 1024


class FrameError(ValueError):
    """A WebSocket message that is not a frame of this protocol."""


@dataclass(frozen=True, slots=True)
class Frame:
    cmd: str  # "" for an ack
    req_id: str
    body: dict | None = None
    errcode: int | None = None
    errmsg: str = ""

    @property
    def is_ack(self) -> bool:
        return not self.cmd and self.errcode is not None

    def encode(self) -> str:
        data: dict = {"cmd": self.cmd, "headers": {"req_id": self.req_id}} if self.cmd else {
            "headers": {"req_id": self.req_id}}
        if self.body is not None:
            data["body"] = self.body
        if self.errcode is not None:
            data["errcode"] = self.errcode
            data["errmsg"] = self.errmsg
        return json.dumps(data, ensure_ascii=False)


def new_req_id(prefix: str) -> str:
    """``<prefix>_<ms>_<random>``: the SDKs' shape, so an ack's req_id tells what it answers."""
    return f"{prefix}_{int(time.time() * 1000)}_{secrets.token_hex(4)}"


def decode(raw: str | bytes) -> Frame:
    if len(raw) > MAX_FRAME_BYTES:
        raise FrameError("frame too large")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise FrameError("frame is not JSON") from None
    if not isinstance(data, dict):
        raise FrameError("frame is not a JSON object")
    headers = data.get("headers")
    req_id = headers.get("req_id") if isinstance(headers, dict) else None
    if not isinstance(req_id, str) or not req_id:
        raise FrameError("frame has no headers.req_id")
    cmd = data.get("cmd") or ""
    if not isinstance(cmd, str):
        raise FrameError("cmd must be a string")
    body = data.get("body")
    if body is not None and not isinstance(body, dict):
        raise FrameError("body must be an object")
    errcode = data.get("errcode")
    if errcode is not None and (isinstance(errcode, bool) or not isinstance(errcode, int)):
        raise FrameError("errcode must be an integer")
    if not cmd and errcode is None:
        raise FrameError("frame has neither cmd nor errcode")
    errmsg = data.get("errmsg") if isinstance(data.get("errmsg"), str) else ""
    return Frame(cmd, req_id, body, errcode, errmsg)


# -- frames the bot sends ------------------------------------------------------------------------
def subscribe(bot_id: str, secret: str) -> Frame:
    return Frame(SUBSCRIBE, new_req_id(SUBSCRIBE), {"bot_id": bot_id, "secret": secret})


def ping() -> Frame:
    return Frame(PING, new_req_id(PING))


def respond_stream(req_id: str, stream_id: str, content: str, finish: bool,
                   feedback_id: str | None = None) -> Frame:
    """A stream frame; ``feedback_id`` on a req_id's first frame opts the reply in to 👍/👎."""
    stream = {"id": stream_id, "finish": bool(finish), "content": content}
    if feedback_id:
        stream["feedback"] = {"id": feedback_id}
    return Frame(RESPOND, req_id, {"msgtype": "stream", "stream": stream})


def respond_welcome(req_id: str, text: str) -> Frame:
    return Frame(RESPOND_WELCOME, req_id, {"msgtype": "text", "text": {"content": text}})


def send_markdown(chatid: str, content: str) -> Frame:
    """``aibot_send_msg``: the bot writes first, to a member's single chat (``chatid`` = the
    userid; WeCom delivers it only where the member has talked to the bot before)."""
    return Frame(SEND, new_req_id(SEND), {"chatid": chatid, "chat_type": 1, "msgtype": "markdown",
                                          "markdown": {"content": content}})


def upload_init(kind: str, filename: str, data: bytes) -> Frame:
    chunks = max(1, -(-len(data) // UPLOAD_CHUNK_BYTES))
    return Frame(UPLOAD_INIT, new_req_id(UPLOAD_INIT), {
        "type": kind, "filename": filename, "total_size": len(data), "total_chunks": chunks,
        "md5": hashlib.md5(data).hexdigest()})  # noqa: S324 - WeCom's integrity check, not security


def upload_chunk(upload_id: str, index: int, data: bytes) -> Frame:
    piece = data[index * UPLOAD_CHUNK_BYTES:(index + 1) * UPLOAD_CHUNK_BYTES]
    return Frame(UPLOAD_CHUNK, new_req_id(UPLOAD_CHUNK), {
        "upload_id": upload_id, "chunk_index": index, "base64_data": base64.b64encode(piece).decode()})


def upload_finish(upload_id: str) -> Frame:
    return Frame(UPLOAD_FINISH, new_req_id(UPLOAD_FINISH), {"upload_id": upload_id})


def send_media(chatid: str, kind: str, media_id: str) -> Frame:
    """``aibot_send_msg`` with an uploaded image or file, to a member's single chat."""
    return Frame(SEND, new_req_id(SEND), {"chatid": chatid, "chat_type": 1, "msgtype": kind,
                                          kind: {"media_id": media_id}})


def ack(req_id: str, errcode: int = 0, errmsg: str = "ok") -> Frame:
    """What WeCom (the emulator) answers to every frame the bot sends."""
    return Frame("", req_id, None, errcode, errmsg)


def event_type(frame: Frame) -> str:
    event = (frame.body or {}).get("event")
    return str(event.get("eventtype") or "") if isinstance(event, dict) else ""


# -- liveness and reconnecting -------------------------------------------------------------------
class Heartbeat:
    """A ping every ``interval_s``; the connection is dead when ``max_missed`` pings in a row
    went unacknowledged (the SDKs' rule)."""

    def __init__(self, interval_s: float, max_missed: int = 2, clock=time.monotonic):
        self.interval_s, self.max_missed, self.clock = interval_s, max_missed, clock
        self.missed = 0
        self._last_sent = clock()

    def due(self) -> bool:
        return self.clock() - self._last_sent >= self.interval_s

    @property
    def dead(self) -> bool:
        return self.missed >= self.max_missed

    def sent(self) -> None:
        self._last_sent = self.clock()
        self.missed += 1

    def acked(self) -> None:
        self.missed = 0


class Backoff:
    """Reconnect delays: exponential from ``base_s``, capped at ``cap_s``, with full jitter
    (a uniform draw below the ceiling), so replicas and restarts do not reconnect in step."""

    def __init__(self, base_s: float = 1.0, cap_s: float = 30.0, rng: random.Random | None = None):
        self.base_s, self.cap_s = base_s, cap_s
        self.rng = rng or random.Random()  # noqa: S311 - jitter, not a secret
        self.attempt = 0

    def ceiling(self) -> float:
        return min(self.cap_s, self.base_s * 2 ** self.attempt)

    def next(self) -> float:
        delay = self.rng.uniform(self.base_s / 2, self.ceiling())
        self.attempt = min(self.attempt + 1, 32)
        return min(delay, self.cap_s)

    def reset(self) -> None:
        self.attempt = 0
