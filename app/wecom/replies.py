"""Passive replies: the XML a callback may answer with (被动回复消息, doc 90241), before encryption.

A self-built app may answer passively with text, image, voice, video, news or a card update;
markdown is *not* among them, so markdown answers go through ``message/send``. This bot answers
asynchronously anyway (an empty 200 first, then ``message/send``): a passive reply is for instant,
canned answers only. ``WeComCrypto.encrypt_reply`` wraps the result for the wire.
"""

from __future__ import annotations

import re
import time

from app.wecom.messages import Message

#: WeCom truncates a passive text reply beyond 2048 bytes; we refuse instead.
TEXT_REPLY_LIMIT = 2048

# Characters XML 1.0 cannot carry at all, even inside CDATA.
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def cdata(value: str) -> str:
    """``value`` as CDATA; a literal ``]]>`` is split across two sections."""
    value = _XML_ILLEGAL.sub("", value)
    return "<![CDATA[" + value.replace("]]>", "]]]]><![CDATA[>") + "]]>"


def build_text_reply(to_user: str, from_user: str, content: str,
                     create_time: int | None = None) -> str:
    """Text reply XML. ``to_user`` is the member's UserID, ``from_user`` the CorpID."""
    if len(content.encode("utf-8")) > TEXT_REPLY_LIMIT:
        raise ValueError(f"passive text reply over {TEXT_REPLY_LIMIT} bytes")
    created = int(time.time()) if create_time is None else int(create_time)
    return (
        f"<xml><ToUserName>{cdata(to_user)}</ToUserName>"
        f"<FromUserName>{cdata(from_user)}</FromUserName>"
        f"<CreateTime>{created}</CreateTime>"
        f"<MsgType><![CDATA[text]]></MsgType>"
        f"<Content>{cdata(content)}</Content></xml>"
    )


def text_reply_to(message: Message, content: str, create_time: int | None = None) -> str:
    """Answer ``message`` with text: back to its sender, from the corp it was sent to."""
    return build_text_reply(message.from_user, message.to_user, content, create_time)
