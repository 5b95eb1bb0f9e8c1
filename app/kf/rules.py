"""What kf/send_msg allows, and when a customer asks for a person.

WeCom lets the company answer a customer for 48 hours after the customer's last message, with
at most 5 messages for each message the customer sent. A reply is cut to 5 text messages (the
last one says it was cut); a message the bot reaches after its window closed is not answered
at all (the row fails with the reason, no send is tried), since WeCom would refuse it.
"""

from __future__ import annotations

import time

from app.wecom.kf import TEXT_LIMIT
from app.wecom.splitting import split_for_wecom

ALONE = ("human", "人工", "客服")  # a message of only this asks for a person too
WINDOW_S = 48 * 3600
MAX_MESSAGES = 5
CUT_NOTE = "\n……（回复过长，已截断 / reply cut short）"
HANDOVER = "kf_handover"  # the reply kind whose delivery ends by handing the customer to a person
HANDOVER_NOTICE = ("正在为您转接人工客服，请稍候。\n"
                   "Connecting you to a member of our team, please wait.")
DECLINE_HANDOVER = "我们的同事会继续为您解答。\nA member of our team will take it from here."


def within_window(send_time: int, now: float | None = None) -> bool:
    """Whether a reply to a message the customer sent at ``send_time`` may still go."""
    return (now if now is not None else time.time()) - send_time <= WINDOW_S


def asks_for_human(text: str, terms: tuple[str, ...]) -> bool:
    """The customer asks for a person (转人工, human, ...; KF_HANDOVER_WORDS)."""
    lowered = text.strip().lower().rstrip("!.?！。？")
    return lowered in ALONE or any(term in lowered for term in terms)


def fit_messages(text: str) -> list[str]:
    """``text`` as at most ``MAX_MESSAGES`` text messages within WeCom's byte limit."""
    chunks = split_for_wecom(text, TEXT_LIMIT)
    if len(chunks) <= MAX_MESSAGES:
        return chunks
    budget = TEXT_LIMIT - len(CUT_NOTE.encode())
    last = chunks[MAX_MESSAGES - 1].encode()[:budget].decode("utf-8", errors="ignore")
    return [*chunks[:MAX_MESSAGES - 1], last + CUT_NOTE]
