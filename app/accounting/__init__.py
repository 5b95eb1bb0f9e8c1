"""Prices, usage, budgets and alerts: what a model call costs and who may still spend.

One job a module:

- ``periods``: budget periods (day, week from Monday, month) in ``COMPANY_TIMEZONE``.
- ``prices``: the versioned price table, costs, and the token estimates charges fall back on.
- ``budgets``: the admin's budget changes, which budgets apply to a call, and the ledger's
  value types (``Admission``, ``Usage``, ``Settled``).
- ``statements``: the ledger writer's SQL (usage rows and rollups, period rows, reservations).
- ``group_commit``: the ledger writer thread: calls waiting together share one transaction.
- ``batch``: what one such transaction does, step by step, each call as if alone.
- ``ledger``: ``Accounting``, the interface callers use (reserve, settle, release, expire, read).
- ``alerts``: raised budget alerts, their text and their delivery (``AlertSender``);
- ``heads``: a department budget's alerts to the department's heads (``DepartmentHeads``);
- ``redelivery``: alerts a dead worker left undelivered, sent again (``redeliver``);
- ``notices``: the notice an employee gets when a budget of theirs is spent.

``Services.accounting`` builds the process's one ``Accounting`` with its ``AlertSender``. The
names below are the package's public face; import them from ``app.accounting``.
"""

from app.accounting.alerts import (
    PERIOD_NAMES,
    SCOPE_NAMES,
    AlertSender,
    RaisedAlert,
    alert_text,
    mark_delivered,
)
from app.accounting.budgets import (
    ACTIONS,
    Admission,
    Settled,
    Usage,
    applicable_budgets,
    parse_thresholds,
    set_budget,
    set_budget_enabled,
)
from app.accounting.heads import DepartmentHeads
from app.accounting.ledger import Accounting
from app.accounting.notices import BudgetNotice, budget_notice
from app.accounting.periods import PERIODS, local_day, period_end, period_start
from app.accounting.prices import (
    FALLBACK_MODEL,
    cost_of,
    estimate_choice_tokens,
    estimate_completion_tokens,
    estimate_prompt_tokens,
    retire_price,
    set_price,
    worst_case,
)
from app.accounting.redelivery import redeliver

__all__ = [
    "ACTIONS", "FALLBACK_MODEL", "PERIODS", "PERIOD_NAMES", "SCOPE_NAMES", "Accounting",
    "Admission", "AlertSender", "BudgetNotice", "DepartmentHeads", "RaisedAlert", "Settled",
    "Usage", "alert_text", "budget_notice", "redeliver",
    "applicable_budgets", "cost_of", "estimate_choice_tokens", "estimate_completion_tokens",
    "estimate_prompt_tokens",
    "local_day", "mark_delivered", "parse_thresholds", "period_end", "period_start",
    "retire_price", "set_budget", "set_budget_enabled", "set_price", "worst_case",
]
