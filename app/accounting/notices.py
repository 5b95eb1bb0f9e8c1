"""What an employee is told when a budget of theirs (their own, their department's, the
company's) is spent: one notice card a period, then a one-line reminder.

The card (Markdown: a bold title, the details quoted; the app channel shows it as WeCom's
markdown message, or as plain text with WECOM_MARKDOWN=false, the AI bot's stream as markdown) says which budget, how much of it is
spent, when it resets in the company's time zone, and whom to ask for more; it goes to the
first message the budget refuses in a period (``worker.metering`` keeps the once-a-period mark).
Later messages in the period get one line pointing back at it, never silence. Markdown rather
than a ``text_notice`` template card: that card must link somewhere (its ``card_action`` is
required) and the product has no page to link to; the AI bot's stream is markdown too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

from app.accounting.periods import period_end, period_start

SCOPES = {"global": ("公司", "company"), "department": ("部门", "department"),
          "user": ("个人", "personal"), "api_key": ("API key", "API key")}
PERIODS = {"day": ("今日", "today"), "week": ("本周", "this week"), "month": ("本月", "this month")}
ASK = {"department": ("请联系部门负责人或管理员", "ask your department head or an administrator"),
       "user": ("请联系管理员", "ask an administrator")}


@dataclass(frozen=True)
class BudgetNotice:
    text: str  # Markdown markup: the channel shows it as markdown or plain text (WECOM_MARKDOWN)
    card: bool  # the card (False: the reminder)
    period_start: datetime
    resets_at: datetime


def budget_notice(budget, spent: Decimal, now: datetime, tz: ZoneInfo, currency: str,
                  first: bool) -> BudgetNotice:
    """The card (``first``) or the reminder for ``budget`` (a Budget or a row with its fields)."""
    start = period_start(budget.period, now, tz)
    resets = period_end(budget.period, start, tz)
    when = resets.astimezone(tz).strftime("%Y-%m-%d %H:%M")
    if not first:
        return BudgetNotice(f"AI 助手预算已用完，{when} 重置，详见此前的通知。\n"
                            f"The assistant's budget is used up until {when} (see the notice above).",
                            False, start, resets)
    scope_zh, scope_en = SCOPES.get(budget.scope, (budget.scope, budget.scope))
    period_zh, period_en = PERIODS.get(budget.period, (budget.period, budget.period))
    ask_zh, ask_en = ASK.get(budget.scope, ASK["user"])
    zone = str(tz)
    card = "\n".join([
        "**AI 助手预算已用完 · Budget used up**",
        f"> 预算 Budget：**{scope_zh}{period_zh}** {scope_en}, {period_en}",
        f"> 已用 Spent：{spent:.2f} / {budget.limit:.2f} {currency}",
        f"> 重置 Resets：{when} ({zone})",
        "",
        f"重置前新的提问不会被回答。如需提高预算，{ask_zh}。",
        f"Until then new questions are not answered. To raise the budget, {ask_en}.",
    ])
    return BudgetNotice(card, True, start, resets)
