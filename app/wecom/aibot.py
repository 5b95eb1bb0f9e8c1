"""The 智能机器人 (AI bot) callback protocol: JSON in, encrypted JSON ``stream`` replies out.

Same SHA1 signature and AES as the self-built app (``crypto.py``), but:

* the receive id is "" (the bot belongs to no CorpID);
* WeCom POSTs ``{"encrypt": "..."}`` and the plaintext is JSON: ``msgid``, ``aibotid``,
  ``chattype`` (``single``/``group``), ``chatid`` (groups), ``from.userid``, ``response_url``,
  ``msgtype`` (``text``, ``mixed``, ``image``, ``voice``, ``file``, ``stream``, ``event``):
  ``text.content``; ``voice.content`` (WeCom's own transcript of the voice message);
  ``image.url`` and ``file.url`` (the bytes behind them AES-256-CBC encrypted with the bot's
  EncodingAESKey, IV its first 16 bytes: ``crypto.decrypt_media``; over the long connection
  each carries its own base64 ``aeskey``, which then takes its place); ``mixed.msg_item``, a
  list of ``text`` and ``image`` items in the order written;
* the reply is the HTTP body, JSON ``{"encrypt", "msgsignature", "timestamp", "nonce"}`` around
  a ``{"msgtype": "stream", "stream": {"id", "finish", "content"}}`` message. While ``finish`` is
  false WeCom keeps POSTing ``msgtype: stream`` refresh callbacks carrying ``stream.id`` (about
  once a second) and shows each reply's ``content`` as the whole text so far; a stream that is
  not finished within 6 minutes expires (errcode 846608);
* a first stream reply may carry ``stream.feedback.id`` (at most 256 bytes): WeCom then shows 👍/👎
  under it, and a rating comes back as ``msgtype: event``, ``event.eventtype: feedback_event``,
  ``event.feedback_event: {id, type (1 accurate, 2 inaccurate, 3 withdrawn), content,
  inaccurate_reason_list}`` (``app/feedback/ratings.py`` records it).

This module parses and builds; it keeps no state (``app/aibot/streams.py`` does).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from app import json_input
from app.wecom.crypto import WeComCrypto
from app.wecom.exceptions import MessageParseError

#: The msgtypes that carry a question for the model (text, a transcript, an image, a file).
QUESTION_TYPES = ("text", "mixed", "voice", "image", "file")
#: The event WeCom sends when an employee rates a reply that carried ``feedback.id``.
FEEDBACK_EVENT = "feedback_event"
#: WeCom's limit on ``feedback.id``: UTF-8, at most 256 bytes.
FEEDBACK_ID_MAX_BYTES = 256
MAX_JSON_BYTES = 256 * 1024
# WeCom separates an @mention from the text with a space or U+2005 (four-per-em space).
_SPACES = " \t\u2005\u00a0\u3000"


class AibotRequestError(ValueError):
    """The POST body is not the AI bot's ``{"encrypt": ...}`` envelope."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AibotMessage:
    """One decrypted callback. ``content`` is the text of ``text``/``mixed`` messages."""

    msg_id: str
    msg_type: str
    from_user: str
    chat_type: str = "single"
    chat_id: str = ""
    aibot_id: str = ""
    response_url: str = ""
    content: str | None = None
    stream_id: str | None = None  # refresh callbacks
    event: str | None = None  # event callbacks: enter_chat, template_card_event, ...
    create_time: int = 0
    agent_id: int | None = None  # the outbox's column; bots have none
    raw_types: tuple[str, ...] = field(default=())  # item types of a mixed message
    image_urls: tuple[str, ...] = field(default=())  # image / mixed: encrypted image URLs
    file_url: str = ""  # file: the encrypted file's URL
    media_keys: tuple[str, ...] = field(default=())  # each image's own aeskey ("" for the bot's)
    file_key: str = ""  # the file's own aeskey, when it has one
    # ``feedback_event`` (a 👍/👎 on an answer, app/feedback/ratings.py): the id our reply carried, WeCom's
    # type (1 accurate, 2 inaccurate, 3 withdrawn; 0 when missing or not a number) and the
    # reason codes; the employee's free text is ``content`` (sealed in the outbox like a question)
    feedback_id: str = ""
    feedback_type: int = 0
    feedback_reasons: tuple[int, ...] = field(default=())

    @property
    def is_group(self) -> bool:
        return self.chat_type == "group"

    @property
    def dedup_key(self) -> str:
        return f"msg:{self.msg_id}"


def extract_encrypt(body: bytes | str) -> str:
    """The ``encrypt`` string of a POST body, or ``AibotRequestError`` saying what is wrong."""
    if len(body) > MAX_JSON_BYTES:
        raise AibotRequestError("body too large")
    try:
        data = json_input.loads(body)
    except json_input.JsonTooDeep as exc:
        raise AibotRequestError(str(exc)) from None
    except ValueError:  # UnicodeDecodeError included
        raise AibotRequestError("body is not JSON") from None
    encrypt = data.get("encrypt") if isinstance(data, dict) else None
    if not isinstance(encrypt, str) or not encrypt.strip():
        raise AibotRequestError("body has no encrypt string")
    return encrypt.strip()


def parse_message(plaintext: bytes | str, received_at: int) -> AibotMessage:
    """Decrypted JSON -> ``AibotMessage``; ``MessageParseError`` for anything WeCom never sends."""
    try:
        data = json_input.loads(plaintext)
    except json_input.JsonTooDeep as exc:
        raise MessageParseError(str(exc)) from None
    except ValueError:
        raise MessageParseError("decrypted message is not JSON") from None
    if not isinstance(data, dict):
        raise MessageParseError("decrypted message is not a JSON object")
    msg_type = _string(data, "msgtype")
    if not msg_type:
        raise MessageParseError("msgtype is missing")
    sender = data.get("from") if isinstance(data.get("from"), dict) else {}
    fields = {
        "msg_id": _string(data, "msgid"), "msg_type": msg_type,
        "from_user": _string(sender, "userid"), "chat_type": _string(data, "chattype") or "single",
        "chat_id": _string(data, "chatid"), "aibot_id": _string(data, "aibotid"),
        "response_url": _string(data, "response_url"), "create_time": int(received_at),
    }
    if msg_type == "stream":
        stream = data.get("stream") if isinstance(data.get("stream"), dict) else {}
        stream_id = _string(stream, "id")
        if not stream_id:
            raise MessageParseError("stream refresh without stream.id")
        return AibotMessage(**fields, stream_id=stream_id)
    if msg_type == "event":
        event = data.get("event") if isinstance(data.get("event"), dict) else {}
        kind = _string(event, "eventtype") or "unknown"
        if kind == FEEDBACK_EVENT:
            return AibotMessage(**fields, event=kind, **_feedback_fields(event.get(FEEDBACK_EVENT)))
        return AibotMessage(**fields, event=kind)
    if not fields["msg_id"]:
        raise MessageParseError("msgid is missing")
    if not fields["from_user"]:
        raise MessageParseError("from.userid is missing")
    if fields["chat_type"] not in ("single", "group"):
        raise MessageParseError("chattype must be single or group")
    if fields["chat_type"] == "group" and not fields["chat_id"]:
        raise MessageParseError("a group message needs chatid")
    if msg_type == "text":
        text = data.get("text") if isinstance(data.get("text"), dict) else {}
        return AibotMessage(**fields, content=_string(text, "content"))
    if msg_type == "mixed":
        items = (data.get("mixed") or {}).get("msg_item") if isinstance(data.get("mixed"), dict) else None
        if not isinstance(items, list):
            raise MessageParseError("mixed message without msg_item list")
        texts, kinds, images, keys = [], [], [], []
        for item in items:
            if not isinstance(item, dict):
                raise MessageParseError("mixed msg_item entries must be objects")
            kinds.append(_string(item, "msgtype"))
            if item.get("msgtype") == "text" and isinstance(item.get("text"), dict):
                texts.append(_string(item["text"], "content"))
            image = item.get("image") if item.get("msgtype") == "image" else None
            if isinstance(image, dict) and _string(image, "url"):
                images.append(_string(image, "url"))
                keys.append(_string(image, "aeskey"))
        return AibotMessage(**fields, content="\n".join(t for t in texts if t), raw_types=tuple(kinds),
                            image_urls=tuple(images), media_keys=tuple(keys))
    if msg_type == "voice":
        voice = data.get("voice") if isinstance(data.get("voice"), dict) else {}
        return AibotMessage(**fields, content=_string(voice, "content"))
    if msg_type == "image":
        image = data.get("image") if isinstance(data.get("image"), dict) else {}
        url = _string(image, "url")
        if not url:
            raise MessageParseError("image message without image.url")
        return AibotMessage(**fields, content="", image_urls=(url,), media_keys=(_string(image, "aeskey"),))
    if msg_type == "file":
        file = data.get("file") if isinstance(data.get("file"), dict) else {}
        url = _string(file, "url")
        if not url:
            raise MessageParseError("file message without file.url")
        return AibotMessage(**fields, content="", file_url=url, file_key=_string(file, "aeskey"))
    return AibotMessage(**fields)  # video, ...: no text for the model


def _feedback_fields(body) -> dict:
    """``event.feedback_event`` read leniently: what is missing or of the wrong kind is left
    empty, and the event is then refused with a log line (``app.feedback.ratings.aibot_problem``), never
    with a 400 that WeCom would retry."""
    if not isinstance(body, dict):
        return {}
    feedback_id, kind = body.get("id"), body.get("type")
    comment, reasons = body.get("content"), body.get("inaccurate_reason_list")
    if isinstance(kind, str) and kind.isdigit() and len(kind) < 4:
        kind = int(kind)
    return {"feedback_id": feedback_id if isinstance(feedback_id, str) else "",
            "feedback_type": kind if type(kind) is int else 0,
            "content": comment if isinstance(comment, str) else None,
            "feedback_reasons": tuple(r for r in reasons if type(r) is int)[:16]
            if isinstance(reasons, list) else ()}


def _string(data: dict, key: str) -> str:
    value = data.get(key)
    if value is None:
        return ""
    if not isinstance(value, str | int):
        raise MessageParseError(f"{key} must be a string")
    return str(value)


def strip_mention(text: str, bot_name: str) -> str | None:
    """The question without its ``@bot`` mention, or None when the bot is not mentioned.

    In a group the bot answers only when addressed; the mention may stand anywhere in the text
    and must end at a space or the end of the text (``@助手呢`` is not ``@助手``).
    """
    if not bot_name:
        return None
    pattern = re.compile("@" + re.escape(bot_name) + f"(?:[{_SPACES}]|$)")
    if not pattern.search(text):
        return None
    return pattern.sub("", text).strip(_SPACES + "\n")


# -- replies -------------------------------------------------------------------------------------
def stream_message(stream_id: str, content: str, finish: bool, feedback_id: str | None = None) -> dict:
    """A stream reply; ``feedback_id`` (the first reply only) opts it in to WeCom's 👍/👎: a
    rating then comes back as a ``feedback_event`` naming that id."""
    stream = {"id": stream_id, "finish": bool(finish), "content": content}
    if feedback_id:
        stream["feedback"] = {"id": feedback_id}
    return {"msgtype": "stream", "stream": stream}


def text_message(content: str) -> dict:
    """The passive text reply WeCom accepts for ``enter_chat`` (a welcome)."""
    return {"msgtype": "text", "text": {"content": content}}


def encrypt_reply(crypto: WeComCrypto, message: dict, timestamp: str, nonce: str) -> dict:
    """A reply message as the encrypted JSON body WeCom expects (WXBizJsonMsgCrypt's shape)."""
    encrypt = crypto.encrypt(json.dumps(message, ensure_ascii=False))
    return {"encrypt": encrypt, "msgsignature": crypto.signature(timestamp, nonce, encrypt),
            "timestamp": timestamp, "nonce": nonce}


def decrypt_reply(crypto: WeComCrypto, body: bytes | str) -> dict:
    """The other side of ``encrypt_reply`` (the emulator and tests): verify, decrypt, parse."""
    data = json.loads(body)
    crypto.check_signature(data.get("msgsignature", ""), str(data.get("timestamp", "")),
                           str(data.get("nonce", "")), data.get("encrypt", ""))
    return json.loads(crypto.decrypt(data["encrypt"]))
