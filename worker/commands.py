"""Chat commands an employee can type instead of a question (``/help``, ``/reset``, ...).

A command answers without the model. Handlers take a ``CommandContext`` and return the reply
text; other areas register theirs with ``register`` (``/forget``: ``worker.media.files``;
``/feedback``: ``worker.feedback``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class CommandContext:
    """Who typed the command, its argument, and what the commands may use: the processor's
    collaborators, never the processor itself."""

    user_id: str
    user_hash: str
    argument: str
    services: Any = None  # app.services.Services
    conversations: Any = None  # worker.conversation.ConversationStore: /reset
    meter: Any = None  # worker.metering.Meter: /usage, /feedback (spend, budgets, the department)
    files: Any = None  # worker.media.files.FileContexts: /forget
    conversation_key: str | None = None  # whose history /reset clears (a group's is its own)


Handler = Callable[[CommandContext], str]
_COMMANDS: dict[str, tuple[str, Handler]] = {}


def register(name: str, summary: str):
    def wrap(handler: Handler) -> Handler:
        _COMMANDS[name] = (summary, handler)
        return handler

    return wrap


def parse(text: str) -> tuple[str, str] | None:
    """``"/reset now"`` -> ("reset", "now"); None when the text is not a command."""
    stripped = text.strip()
    if not stripped.startswith(("/", "／")) or len(stripped) < 2:
        return None
    name, _, argument = stripped[1:].partition(" ")
    return name.lower(), argument.strip()


def run(name: str, context: CommandContext) -> str:
    entry = _COMMANDS.get(name)
    if entry is None:
        return f"未知命令 /{name}。输入 /help 查看可用命令。\nUnknown command /{name}; type /help."
    return entry[1](context)


@register("help", "查看可用命令 / list the commands")
def _help(_: CommandContext) -> str:
    lines = ["可用命令 / Commands:"]
    lines += [f"/{name} — {summary}" for name, (summary, _) in sorted(_COMMANDS.items())]
    lines.append("其他内容会直接交给 AI 助手回答。Anything else goes to the assistant.")
    return "\n".join(lines)


@register("reset", "清空我的对话记录 / forget our conversation")
def _reset(context: CommandContext) -> str:
    context.conversations.reset(context.conversation_key or context.user_hash)
    return "好的，我们重新开始吧。Conversation cleared."


@register("usage", "我本期的用量和剩余预算 / my spend and remaining budget")
def _usage(context: CommandContext) -> str:
    from datetime import timedelta

    from app.accounting import PERIOD_NAMES, SCOPE_NAMES, local_day
    from app.db import utcnow

    meter = context.meter
    accounting = meter.accounting
    department = meter.department_of(context.user_hash, context.user_id)
    today = local_day(utcnow(), accounting.tz)
    # The user under every key of the blind-index ring (one until a key rotation is under way).
    hashes = context.services.blind_index.candidates("wecom-user", context.user_id)
    with accounting.db.session() as session:
        spent_today = accounting.user_spend(session, hashes, today)
        spent_month = accounting.user_spend(session, hashes, today.replace(day=1))
        spent_week = accounting.user_spend(session, hashes, today - timedelta(days=today.weekday()))
    currency = accounting.currency
    lines = ["我的用量 / My usage:",
             f"今日 today {spent_today:.4f} {currency} · 本周 this week {spent_week:.4f} · "
             f"本月 this month {spent_month:.4f}"]
    statuses = accounting.budget_status(context.user_hash, department, user_hashes=hashes)
    if not statuses:
        lines.append("没有设置预算上限。No budget limit applies to you.")
    for status in statuses:
        budget = status["budget"]
        lines.append(f"{SCOPE_NAMES.get(budget.scope, budget.scope)} "
                     f"{PERIOD_NAMES.get(budget.period, budget.period)}: "
                     f"{status['spent']:.4f} / {budget.limit:.4f} {budget.currency}, "
                     f"剩余 remaining {status['remaining']:.4f}")
    return "\n".join(lines)
