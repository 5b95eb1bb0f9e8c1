"""The demo's planner (``TOOLS_PLANNER=intent``): a small deterministic router from the
employee's words to one offered tool and its arguments.

The bundled demo model is too small to call tools reliably, so the demo chooses by keywords
instead; with a real model (GLM-4.5 and later, ``TOOLS_PLANNER=model``) the model chooses. The
router only picks among the tools the asker was offered, never anything else.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

_DIGITS = {"零": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8,
           "九": 9, "十": 10}
# (tool, what it is about, how a question asks for the asker's own data): both must appear, so a
# policy question ("How many days of childcare leave do I get?", "报销流程是什么") stays with the
# knowledge base and only "我还有几天年假" / "where is my claim EX-1234" reaches a tool
_INTENTS = (
    ("leave_balance", re.compile(r"年假|假期|休假|调休|病假|假|leave", re.I),
     re.compile(r"还剩|剩下|剩余|余额|还有(几|多少)|还能休(几|多少)|\b(balance|left|remaining)\b", re.I)),
    ("expense_claim_status", re.compile(r"报销|expense|claim", re.I),
     re.compile(r"到哪|进度|状态|审批到|批了(吗|没)|到账了?(吗|没)|\bstatus\b|\bwhere\b.{0,20}\bmy\b"
                r"|\b[A-Z]{2}-?\d{3,8}\b", re.I)),
    ("book_meeting_room", re.compile(r"(订|预订|预定|约|book).{0,12}(会议室|meeting room)", re.I), None),
)


def _number(text: str) -> int | None:
    if text.isdigit():
        return int(text)
    if text == "十":
        return 10
    if text.startswith("十"):
        return 10 + _DIGITS.get(text[1:], 0)
    if "十" in text:
        tens, _, ones = text.partition("十")
        return _DIGITS.get(tens, 0) * 10 + (_DIGITS.get(ones, 0) if ones else 0)
    return _DIGITS.get(text)


def when(text: str, now: datetime) -> datetime | None:
    """"明天下午两点", "今天 15:30", "后天上午十点" as a time in ``now``'s zone."""
    day = now.date()
    if "后天" in text:
        day += timedelta(days=2)
    elif "明天" in text:
        day += timedelta(days=1)
    match = re.search(r"(\d{1,2})[:：](\d{2})", text) or re.search(r"([0-9一二两三四五六七八九十]{1,3})\s*点(半)?", text)
    if match is None:
        return None
    hour = _number(match.group(1))
    if hour is None or hour > 23:
        return None
    minute = 30 if match.group(2) == "半" else int(match.group(2)) if match.group(2) and match.group(2).isdigit() else 0
    if re.search(r"下午|晚上|傍晚", text) and hour < 12:
        hour += 12
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=now.tzinfo)


def route(text: str, offered, timezone="Asia/Shanghai", now: datetime | None = None):
    """(the OfferedTool, its arguments) for ``text``, or None when no offered tool fits.
    ``timezone``: a name or a tzinfo (the settings' TIMEZONE)."""
    by_tool = {tool.tool: tool for tool in offered}
    zone = ZoneInfo(timezone) if isinstance(timezone, str) else timezone
    now = now or datetime.now(zone)
    for name, topic, asks_own in _INTENTS:
        if name not in by_tool or not topic.search(text) or (asks_own and not asks_own.search(text)):
            continue
        if name == "book_meeting_room":
            start = when(text, now)
            if start is None:
                continue
            arguments = {"start": start.isoformat(timespec="minutes"), "duration_minutes": 60}
            room = re.search(r"([A-Za-z0-9]{1,6})\s*会议室", text)
            if room:
                arguments["room"] = room.group(1)
            return by_tool[name], arguments
        if name == "expense_claim_status":
            claim = re.search(r"\b([A-Z]{2}-?\d{3,8})\b", text)
            return by_tool[name], ({"claim_id": claim.group(1)} if claim else {})
        return by_tool[name], {}
    return None
