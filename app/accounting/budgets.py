"""Budgets: the admin's changes, which budgets apply to a call, and the ledger's value types.

A budget has a scope (global, department, user, API key), a period (``app.accounting.periods``),
a limit, thresholds (percentages, each alerted once a period) and an action at 100 %: ``block``
refuses new calls, ``warn`` lets them pass.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from sqlalchemy import and_, bindparam, or_, select
from sqlalchemy.orm import Session

from app.accounting.alerts import RaisedAlert
from app.accounting.periods import PERIODS
from app.db import to_money
from app.models import Budget, BudgetScope

ACTIONS = ("block", "warn")


@dataclass
class Admission:
    allowed: bool
    reservation_id: int | None = None
    amount: Decimal = Decimal(0)
    blocked_by: Any = None  # the budget that refused: a Budget, or a row with its attributes
    spent: Decimal = Decimal(0)
    user_hash: str = ""
    department: str = ""
    api_key_id: str | None = None
    model: str = ""  # the configured model: what the call is priced by
    message_id: int | None = None
    prompt_tokens: int = 0  # the prompt's estimate, an upper bound: settle charges at least this
    # False: admitted knowing no budget was enabled (the worker reads it with its claim); its
    # settle records the usage and charges no budget, without reading them
    budgeted: bool = True


@dataclass
class Usage:
    user_hash: str
    department: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    latency_ms: int = 0
    api_key_id: str | None = None
    message_id: int | None = None
    # Upper-bound estimates (the text's UTF-8 bytes): charged when larger than what the model
    # server reported, which may be nothing at all.
    estimated_prompt_tokens: int = 0
    estimated_completion_tokens: int = 0


@dataclass
class Settled:
    cost: Decimal
    alerts: list[RaisedAlert] = field(default_factory=list)


def parse_thresholds(spec: str) -> list[int]:
    return sorted({int(p) for p in spec.split(",") if p.strip()})


def set_budget(session: Session, scope: str, scope_value: str, period: str, limit,
               action: str = "block", thresholds: str = "50,80,100",
               currency: str = "CNY") -> Budget:
    """Create or change the budget of a scope and period."""
    if scope not in BudgetScope.ALL:
        raise ValueError(f"scope must be one of {BudgetScope.ALL}")
    if period not in PERIODS:
        raise ValueError(f"period must be one of {PERIODS}")
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {ACTIONS}")
    if scope == BudgetScope.GLOBAL:
        scope_value = ""
    elif not scope_value:
        raise ValueError(f"a {scope} budget needs the {scope} it applies to")
    limit = to_money(limit)
    if limit <= 0:
        raise ValueError("the limit must be positive")
    parse_thresholds(thresholds)
    budget = session.scalar(select(Budget).where(Budget.scope == scope,
                                                 Budget.scope_value == scope_value,
                                                 Budget.period == period))
    if budget is None:
        budget = Budget(scope=scope, scope_value=scope_value, period=period)
        session.add(budget)
    budget.limit, budget.action, budget.thresholds = limit, action, thresholds
    budget.currency, budget.enabled = currency, True
    session.flush()
    return budget


def set_budget_enabled(session: Session, budget_id: int, enabled: bool) -> Budget:
    """Switch a budget off (it stops applying; its history stays) or on again."""
    budget = session.get(Budget, budget_id)
    if budget is None:
        raise LookupError(f"no budget {budget_id}")
    budget.enabled = enabled
    session.flush()
    return budget


@functools.cache
def _budgets_statement(department: bool, api_key: bool):
    """The enabled budgets of a user (``hashes``), a department and an API key, built once per
    shape: made per call, it was the worker's costliest statement to build."""
    scopes = [Budget.scope == BudgetScope.GLOBAL,
              and_(Budget.scope == BudgetScope.USER,
                   Budget.scope_value.in_(bindparam("hashes", expanding=True)))]
    if department:
        scopes.append(and_(Budget.scope == BudgetScope.DEPARTMENT,
                           Budget.scope_value == bindparam("department")))
    if api_key:
        scopes.append(and_(Budget.scope == BudgetScope.API_KEY,
                           Budget.scope_value == bindparam("api_key_id")))
    return select(Budget).where(Budget.enabled.is_(True), or_(*scopes)).order_by(Budget.id)


def applicable_budgets(session: Session, user_hash: str | Sequence[str], department: str,
                       api_key_id: str | None = None) -> list[Budget]:
    """``user_hash`` may list the user's blind index under every key of the ring (a budget set
    under an older key still applies until ``keys rotate-index`` moves it)."""
    hashes = [user_hash] if isinstance(user_hash, str) else list(user_hash)
    params = {"hashes": hashes}
    if department:
        params["department"] = department
    if api_key_id:
        params["api_key_id"] = api_key_id
    return list(session.scalars(_budgets_statement(bool(department), bool(api_key_id)), params))


def budget_applies(budget: Budget, hashes: Sequence[str], department: str,
                   api_key_id: str | None) -> bool:
    """Whether ``budget`` is one of ``applicable_budgets(hashes, department, api_key_id)``."""
    if budget.scope == BudgetScope.GLOBAL:
        return True
    if budget.scope == BudgetScope.USER:
        return budget.scope_value in hashes
    if budget.scope == BudgetScope.DEPARTMENT:
        return bool(department) and budget.scope_value == department
    if budget.scope == BudgetScope.API_KEY:
        return bool(api_key_id) and budget.scope_value == api_key_id
    return False
