"""Decrypted callback XML of a self-built app -> typed, frozen messages and events.

What WeCom sends (接收消息与事件, docs 90239 message formats and 90240 event formats):

* every callback: ToUserName (the CorpID), FromUserName (the member's UserID), CreateTime (unix
  seconds), MsgType, AgentID;
* messages (text, image, voice, video, location, link) also carry MsgId;
* events (MsgType ``event``) carry Event and, unlike messages, no MsgId. WeCom retries an
  unanswered callback up to 3 times, so ``dedup_key`` is built from MsgId for messages and from
  FromUserName + CreateTime + Event for events.

``file`` is not on WeCom's list of app messages (90239), but some clients send one (``MediaId``,
sometimes ``Title``/``FileName``); it is read as ``FileMessage`` so an employee's PDF is not lost.
``kf_msg_or_event`` (微信客服: customer messages to fetch with kf/sync_msg) is read as ``KfEvent``.
``change_contact`` (the address book changed) is read as ``ContactChangeEvent``: the worker
forgets the member's cached departments (``worker.scope.directory``). Anything else (a message type
or event this module does not model, such as the approval events) comes back as ``UnknownMessage``/``UnknownEvent`` with all
of its fields in ``raw``: new WeCom features must never break the callback.

Which class reads a callback is a table, ``MESSAGE_TYPES`` (MsgType) and ``EVENT_TYPES``
(Event), filled by the classes' decorators (``@message_type("text")``, ``@event_type("click")``),
wechatpy's way: a new type is one class, its decorator and its ``read`` (the fields it takes).

Parsing (``xmlparse``) refuses any DTD before a declaration in it is read, which refuses
billion-laughs bombs and XXE before any expansion happens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from app.wecom import xmlparse
from app.wecom.exceptions import MessageParseError

logger = logging.getLogger(__name__)

#: A decrypted callback is a few hundred bytes; anything this big is not from WeCom.
MAX_XML_BYTES = 256 * 1024
KF_EVENT = "kf_msg_or_event"

#: MsgType -> its class, and (MsgType ``event``) Event -> its class: the one place a type is
#: added (wechatpy's registry). A class reads its own fields from the callback (``read``).
MESSAGE_TYPES: dict[str, type[Message]] = {}
EVENT_TYPES: dict[str, type[Message]] = {}


def _register(table: dict[str, type], keys: tuple[str, ...]):
    def register(cls):
        for key in keys:
            if key in table and table[key] is not cls:
                raise ValueError(f"{key!r} is already read as {table[key].__name__}")
            table[key] = cls
        return cls

    return register


def message_type(*msg_types: str):
    """Class decorator: callbacks with one of these MsgTypes are read as this class."""
    return _register(MESSAGE_TYPES, msg_types)


def event_type(*events: str):
    """Class decorator: events (MsgType ``event``) with one of these Events are read as this class."""
    return _register(EVENT_TYPES, events)


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """Fields every callback has. ``msg_id`` is None for events, ``event`` None for messages."""

    to_user: str
    from_user: str
    create_time: int
    msg_type: str
    agent_id: int | None
    msg_id: str | None = None
    event: str | None = None

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        """This type's own fields from the callback's (the common ones are read before)."""
        return {}

    @property
    def is_event(self) -> bool:
        return self.msg_type == "event"

    @property
    def dedup_key(self) -> str:
        if self.is_event:
            return f"evt:{self.from_user}:{self.create_time}:{self.event}"
        return f"msg:{self.msg_id}"


# --- messages ------------------------------------------------------------------------------


@message_type("text")
@dataclass(frozen=True, slots=True, kw_only=True)
class TextMessage(Message):
    content: str

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        # Kept verbatim (indentation of pasted code matters); blank is odd but not malformed.
        content = f.get("Content")
        if not isinstance(content, str):
            raise MessageParseError("missing Content")
        return {"content": content}


@message_type("image")
@dataclass(frozen=True, slots=True, kw_only=True)
class ImageMessage(Message):
    pic_url: str
    media_id: str

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        return {"pic_url": _optional(f, "PicUrl"), "media_id": _required(f, "MediaId")}


@message_type("voice")
@dataclass(frozen=True, slots=True, kw_only=True)
class VoiceMessage(Message):
    media_id: str
    format: str  # amr or speex

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        return {"media_id": _required(f, "MediaId"), "format": _optional(f, "Format")}


@message_type("file")
@dataclass(frozen=True, slots=True, kw_only=True)
class FileMessage(Message):
    media_id: str
    file_name: str = ""  # when the callback names it; media/get's Content-Disposition does too

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        return {"media_id": _required(f, "MediaId"),
                "file_name": _optional(f, "FileName") or _optional(f, "Title")}


@message_type("video")
@dataclass(frozen=True, slots=True, kw_only=True)
class VideoMessage(Message):
    media_id: str
    thumb_media_id: str

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        return {"media_id": _required(f, "MediaId"), "thumb_media_id": _optional(f, "ThumbMediaId")}


@message_type("location")
@dataclass(frozen=True, slots=True, kw_only=True)
class LocationMessage(Message):
    location_x: float  # latitude
    location_y: float  # longitude
    scale: int
    label: str

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        return {"location_x": _number(f, "Location_X", float), "location_y": _number(f, "Location_Y", float),
                "scale": _number(f, "Scale", int), "label": _optional(f, "Label")}


@message_type("link")
@dataclass(frozen=True, slots=True, kw_only=True)
class LinkMessage(Message):
    title: str
    description: str
    url: str
    pic_url: str

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        return {"title": _optional(f, "Title"), "description": _optional(f, "Description"),
                "url": _required(f, "Url"), "pic_url": _optional(f, "PicUrl")}


@dataclass(frozen=True, slots=True, kw_only=True)
class UnknownMessage(Message):
    raw: dict[str, Any] = field(default_factory=dict)


# --- events --------------------------------------------------------------------------------


@event_type("subscribe")
@dataclass(frozen=True, slots=True, kw_only=True)
class SubscribeEvent(Message):
    """A member started following the app (成员关注)."""


@event_type("unsubscribe")
@dataclass(frozen=True, slots=True, kw_only=True)
class UnsubscribeEvent(Message):
    """A member stopped following the app (成员取消关注)."""


@event_type("enter_agent")
@dataclass(frozen=True, slots=True, kw_only=True)
class EnterAgentEvent(Message):
    """A member opened the app (进入应用); EventKey is documented as empty."""

    event_key: str = ""

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        return {"event_key": _optional(f, "EventKey")}


@event_type("click")
@dataclass(frozen=True, slots=True, kw_only=True)
class ClickEvent(Message):
    """A member tapped a menu item that pulls a message; ``event_key`` is the item's key."""

    event_key: str

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        return {"event_key": _optional(f, "EventKey")}


@event_type("view")
@dataclass(frozen=True, slots=True, kw_only=True)
class ViewEvent(Message):
    """A member tapped a menu link; ``event_key`` is the URL."""

    event_key: str

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        return {"event_key": _optional(f, "EventKey")}


@event_type("location")
@dataclass(frozen=True, slots=True, kw_only=True)
class LocationEvent(Message):
    """Location report (上报地理位置), sent when the app has location reporting switched on."""

    latitude: float
    longitude: float
    precision: float

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        return {"latitude": _number(f, "Latitude", float), "longitude": _number(f, "Longitude", float),
                "precision": _number(f, "Precision", float)}


@event_type("scancode_push", "scancode_waitmsg")
@dataclass(frozen=True, slots=True, kw_only=True)
class ScanCodeEvent(Message):
    """Menu scan events ``scancode_push`` and ``scancode_waitmsg``."""

    event_key: str
    scan_type: str
    scan_result: str

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        info = f.get("ScanCodeInfo")
        info = info if isinstance(info, dict) else {}
        return {"event_key": _optional(f, "EventKey"), "scan_type": _optional(info, "ScanType"),
                "scan_result": _optional(info, "ScanResult")}


@event_type("template_card_event")
@dataclass(frozen=True, slots=True, kw_only=True)
class TemplateCardEvent(Message):
    """A member clicked a button of a template card the app sent (template_card_event)."""

    event_key: str
    task_id: str
    card_type: str = ""
    response_code: str = ""
    # SelectedItems: each question's key -> the option ids chosen (a drop-down's, a vote's)
    selected: dict[str, list[str]] = field(default_factory=dict)

    @property
    def dedup_key(self) -> str:
        """A click is one card's: two cards rated within one second are two events, while
        WeCom's retries of one click repeat its TaskId too."""
        return f"evt:{self.from_user}:{self.create_time}:{self.event}:{self.task_id}"

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        return {"event_key": _optional(f, "EventKey"), "task_id": _optional(f, "TaskId"),
                "card_type": _optional(f, "CardType"), "response_code": _optional(f, "ResponseCode"),
                "selected": _selected_items(f.get("SelectedItems"))}


@event_type("change_contact")
@dataclass(frozen=True, slots=True, kw_only=True)
class ContactChangeEvent(Message):
    """The address book changed (通讯录变更, ``change_contact``; FromUserName is ``sys``, no
    AgentID). ``change_type``: ``create_user``, ``update_user``, ``delete_user`` (and the
    department and tag changes); ``user_id`` is the member's UserID, ``new_user_id`` their new
    one when it changed; ``departments`` the new Department list when it changed, else empty."""

    change_type: str
    user_id: str = ""
    new_user_id: str = ""
    departments: str = ""

    @property
    def dedup_key(self) -> str:
        # Every change comes from "sys": two changes in one second (two members, or one member
        # twice) are two events; WeCom's retry of one repeats all of its fields.
        return (f"evt:{self.from_user}:{self.create_time}:{self.event}:{self.change_type}:"
                f"{self.user_id}:{self.new_user_id}:{self.departments}")

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        return {"change_type": _optional(f, "ChangeType"), "user_id": _optional(f, "UserID"),
                "new_user_id": _optional(f, "NewUserID"), "departments": _optional(f, "Department")}


@event_type(KF_EVENT)
@dataclass(frozen=True, slots=True, kw_only=True)
class KfEvent(Message):
    """微信客服: customer messages are waiting (kf_msg_or_event). It names no sender: the kf
    account (``open_kfid``) stands in ``from_user``, so one account's events are worked in order;
    ``token`` lets kf/sync_msg read them within 10 minutes (``app.kf``)."""

    token: str
    open_kfid: str

    @property
    def dedup_key(self) -> str:
        return f"evt:kf:{self.open_kfid}:{self.create_time}:{self.token}"

    @staticmethod
    def read(f: dict[str, Any]) -> dict[str, Any]:
        return {"token": _required(f, "Token"), "open_kfid": _required(f, "OpenKfId")}


@dataclass(frozen=True, slots=True, kw_only=True)
class UnknownEvent(Message):
    raw: dict[str, Any] = field(default_factory=dict)


# --- parsing -------------------------------------------------------------------------------


def parse_message(xml: str | bytes) -> Message:
    """Parse one decrypted callback; raise ``MessageParseError`` when it is not one."""
    fields = _xml_to_dict(xml)
    if isinstance(fields.get("Event"), str) and fields["Event"].strip().lower() == KF_EVENT:
        fields.setdefault("FromUserName", fields.get("OpenKfId"))  # the event names no sender
    common = _common_fields(fields)
    if common["msg_type"] == "event":
        return _parse_event(fields, common)
    return _parse_user_message(fields, common)


def _xml_to_dict(xml: str | bytes) -> dict[str, Any]:
    if isinstance(xml, str):
        xml = xml.encode("utf-8")
    if not isinstance(xml, bytes):
        raise MessageParseError("callback body must be str or bytes")
    if len(xml) > MAX_XML_BYTES:
        raise MessageParseError("callback xml too large")
    try:
        root, fields = xmlparse.parse(xml)
    except xmlparse.XmlRefused as exc:
        raise MessageParseError(f"forbidden xml construct: {exc}") from None
    except xmlparse.XmlMalformed as exc:
        raise MessageParseError(f"malformed xml: {exc}") from None
    if root != "xml":
        raise MessageParseError("root element is not <xml>")
    return fields


def _required(fields: dict[str, Any], name: str) -> str:
    value = fields.get(name)
    if not isinstance(value, str) or not value.strip():
        raise MessageParseError(f"missing {name}")
    return value.strip()


def _optional(fields: dict[str, Any], name: str) -> str:
    value = fields.get(name, "")
    return value.strip() if isinstance(value, str) else ""


def _number(fields: dict[str, Any], name: str, kind: type[int] | type[float]) -> Any:
    text = _required(fields, name)
    try:
        return kind(text)
    except ValueError:
        raise MessageParseError(f"{name} is not a number") from None


def _common_fields(fields: dict[str, Any]) -> dict[str, Any]:
    agent = _optional(fields, "AgentID")
    try:
        agent_id = int(agent) if agent else None
    except ValueError:
        raise MessageParseError("AgentID is not a number") from None
    create_time = _number(fields, "CreateTime", int)
    if not 0 <= create_time < 2**63:  # seconds since 1970, stored in a 64-bit column
        raise MessageParseError("CreateTime is out of range")
    return {
        "to_user": _required(fields, "ToUserName"),
        "from_user": _required(fields, "FromUserName"),
        "create_time": create_time,
        "msg_type": _required(fields, "MsgType").lower(),
        "agent_id": agent_id,
    }


def _parse_user_message(f: dict[str, Any], common: dict[str, Any]) -> Message:
    common["msg_id"] = _required(f, "MsgId")
    kind = MESSAGE_TYPES.get(common["msg_type"])
    if kind is None:
        # Type only: the content and the user id stay out of the logs.
        logger.info("unknown WeCom message type %r kept as UnknownMessage", common["msg_type"][:32])
        return UnknownMessage(**common, raw=f)
    return kind(**common, **kind.read(f))


def _as_list(value) -> list:
    return value if isinstance(value, list) else [] if value is None else [value]


def _selected_items(items) -> dict[str, list[str]]:
    """``<SelectedItems><SelectedItem><QuestionKey/><OptionIds><OptionId/>...`` as
    {question key: [option ids]} (at most 20 questions of 20 options, each id 128 characters)."""
    found: dict[str, list[str]] = {}
    if not isinstance(items, dict):
        return found
    for item in _as_list(items.get("SelectedItem"))[:20]:
        if not isinstance(item, dict) or not isinstance(item.get("QuestionKey"), str):
            continue
        ids = item.get("OptionIds")
        options = _as_list(ids.get("OptionId")) if isinstance(ids, dict) else []
        found[item["QuestionKey"][:1024]] = [o[:128] for o in options[:20] if isinstance(o, str)]
    return found


def _parse_event(f: dict[str, Any], common: dict[str, Any]) -> Message:
    event = _required(f, "Event").lower()
    common["event"] = event
    kind = EVENT_TYPES.get(event)
    if kind is None:
        logger.info("unknown WeCom event %r kept as UnknownEvent", event[:32])
        return UnknownEvent(**common, raw=f)
    return kind(**common, **kind.read(f))
