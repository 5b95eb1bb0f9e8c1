"""Prices, usage, budgets and alerts.

- **Prices** are versioned: a model's price is the row with the latest ``valid_from`` not after
  the call (model ``"*"`` is the fallback), in currency per million tokens (input, cached input,
  output). Amounts are ``Decimal`` rounded to millionths (``app.db.Money``).
- **Usage**: one ``usage_records`` row per model call, and in the same transaction an atomic
  upsert (``INSERT ... ON CONFLICT DO UPDATE``) of the ``usage_daily`` rollup per company-local
  day x department x user x model, which the dashboards read.
- **Budgets** by scope (global, department, user, API key) and period (day, week from Monday,
  month), aligned to local midnight in ``COMPANY_TIMEZONE``. Before a generation ``reserve`` holds
  its worst case (prompt estimate x input price + max_new_tokens x output price) on every
  applicable budget's period row, under a row lock (PostgreSQL ``FOR UPDATE``; SQLite's write
  lock); a budget whose spent + reserved has reached its limit refuses (``block``) or lets it pass
  (``warn``). ``settle`` turns the reservation into the real cost, ``release`` drops it (the
  generation failed). A request is admitted only while the budget is not exhausted, so concurrent
  requests overspend by at most one request's worst case.
- **Charges fail closed**: a call is charged the larger of the token counts the model reported
  and the estimates (``estimate_prompt_tokens``, ``estimate_completion_tokens``: upper bounds in
  UTF-8 bytes), so a server that reports no ``usage`` or too little is not a free model; it is
  priced by the configured model the reservation named, never by the name the server answered
  with. A reservation nobody settled (a worker killed mid-call, a charge that failed) is charged
  its worst case when it expires (``expire_reservations``), not released.
- **Alerts**: a threshold (percent of the limit) reached is one ``budget_alerts`` row, unique per
  (budget, period start, threshold), so each alert is raised once even under concurrency; it is
  audited and then sent (WeCom message to ``ALERT_WECOM_USERS``, optional webhook) off the reply
  path, in a background thread with a timeout.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

from sqlalchemy import and_, bindparam, delete, func, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.audit import EventType
from app.db import to_money, utcnow
from app.models import (
    Budget,
    BudgetAlert,
    BudgetPeriod,
    BudgetReservation,
    BudgetScope,
    ModelPrice,
    UsageDaily,
    UsageRecord,
)

log = logging.getLogger(__name__)
PERIODS = ("day", "week", "month")
ACTIONS = ("block", "warn")
MILLION = Decimal(1_000_000)
FALLBACK_MODEL = "*"


# -- periods ---------------------------------------------------------------------------------------
def period_start(period: str, at: datetime, tz: ZoneInfo) -> datetime:
    """The UTC instant the period containing ``at`` began: local midnight (Monday, the 1st)."""
    local = at.astimezone(tz)
    day = local.date()
    if period == "week":
        day -= timedelta(days=day.weekday())
    elif period == "month":
        day = day.replace(day=1)
    elif period != "day":
        raise ValueError(f"unknown period {period!r}")
    return datetime(day.year, day.month, day.day, tzinfo=tz).astimezone(ZoneInfo("UTC"))


def period_end(period: str, start: datetime, tz: ZoneInfo) -> datetime:
    local = start.astimezone(tz).date()
    if period == "day":
        nxt = local + timedelta(days=1)
    elif period == "week":
        nxt = local + timedelta(days=7)
    else:
        nxt = (local.replace(day=28) + timedelta(days=4)).replace(day=1)
    return datetime(nxt.year, nxt.month, nxt.day, tzinfo=tz).astimezone(ZoneInfo("UTC"))


def local_day(at: datetime, tz: ZoneInfo) -> date:
    return at.astimezone(tz).date()


# -- prices and costs ------------------------------------------------------------------------------
def set_price(session: Session, model: str, input_per_m, cached_input_per_m, output_per_m,
              currency: str = "CNY", valid_from: datetime | None = None) -> ModelPrice:
    price = ModelPrice(model=model, input_per_m=to_money(input_per_m),
                       cached_input_per_m=to_money(cached_input_per_m),
                       output_per_m=to_money(output_per_m), currency=currency,
                       valid_from=valid_from or utcnow())
    session.add(price)
    session.flush()
    return price


@functools.cache
def _price_statement():
    """The latest version of one model's price in effect at a time, built once (made per call,
    the statement cost the worker more CPU than the database spent on it)."""
    return (select(ModelPrice)
            .where(ModelPrice.model == bindparam("model"),
                   ModelPrice.valid_from <= bindparam("at", type_=ModelPrice.valid_from.type))
            .order_by(ModelPrice.valid_from.desc()).limit(1))


def price_for(session: Session, model: str, at: datetime | None = None) -> ModelPrice | None:
    at = at or utcnow()
    for name in (model, FALLBACK_MODEL):
        price = session.scalar(_price_statement(), {"model": name, "at": at})
        if price is not None:
            return price
    return None


def cost_of(price: ModelPrice | None, prompt_tokens: int, cached_tokens: int,
            completion_tokens: int) -> Decimal:
    if price is None:
        return Decimal(0)
    cached = min(max(cached_tokens, 0), prompt_tokens)
    total = ((prompt_tokens - cached) * price.input_per_m + cached * price.cached_input_per_m
             + completion_tokens * price.output_per_m)
    return to_money(total / MILLION)


def worst_case(price: ModelPrice | None, prompt_tokens: int, max_new_tokens: int) -> Decimal:
    """The most a call can cost: no cache hit, every allowed token generated."""
    return cost_of(price, prompt_tokens, 0, max_new_tokens)


TEMPLATE_TOKENS_PER_MESSAGE = 8  # role token, newline, metadata, separators: GLM's use 2-4
TEMPLATE_TOKENS_PER_PROMPT = 8  # [gMASK]<sop>, the generation prompt, an empty think part


def _utf8_len(value) -> int:
    if value is None:
        return 0
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False)
    return len(value.encode("utf-8", "surrogatepass"))


def estimate_prompt_tokens(messages: Iterable[dict]) -> int:
    """An upper bound on the prompt's tokens without a tokenizer: its UTF-8 bytes.

    Every token of a byte-level BPE tokenizer (GLM's) covers at least one byte of text, and one
    with byte fallback spends at most one token a byte, so no text (emoji, rare CJK outside the
    vocabulary: 4 bytes, up to 4 tokens, for one character) takes more tokens than bytes. The
    role and the template's tokens are added for every message and once for the prompt.
    """
    return TEMPLATE_TOKENS_PER_PROMPT + sum(
        _utf8_len(m.get("content")) + _utf8_len(m.get("reasoning_content"))
        + _utf8_len(m.get("role")) + TEMPLATE_TOKENS_PER_MESSAGE for m in messages)


def estimate_completion_tokens(text: str, reasoning: str = "") -> int:
    """An upper bound on the tokens that wrote ``text`` (and a think part): their UTF-8 bytes,
    and the think tags."""
    return _utf8_len(text) + _utf8_len(reasoning) + (2 if reasoning else 0)


# -- budgets ---------------------------------------------------------------------------------------
@dataclass
class Admission:
    allowed: bool
    reservation_id: int | None = None
    amount: Decimal = Decimal(0)
    blocked_by: Budget | None = None
    spent: Decimal = Decimal(0)
    user_hash: str = ""
    department: str = ""
    api_key_id: str | None = None
    model: str = ""  # the configured model: what the call is priced by
    message_id: int | None = None
    prompt_tokens: int = 0  # the prompt's estimate, an upper bound: settle charges at least this


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
class RaisedAlert:
    alert_id: int
    budget_id: int
    scope: str
    scope_value: str
    period: str
    period_start: datetime
    threshold: int
    spent: Decimal
    limit: Decimal
    currency: str
    action: str

    def as_json(self) -> dict:
        return {"type": "budget_alert", "alert_id": self.alert_id, "budget_id": self.budget_id,
                "scope": self.scope, "scope_value": self.scope_value, "period": self.period,
                "period_start": self.period_start.isoformat(), "threshold": self.threshold,
                "spent": str(self.spent), "limit": str(self.limit), "currency": self.currency,
                "action": self.action}


@dataclass
class Settled:
    usage_id: int
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


def retire_price(session: Session, price_id: int, now: datetime | None = None) -> ModelPrice:
    """Delete a price version that has not taken effect yet.

    A version already in effect has priced calls (``usage_records.price_id``): it stays, and a
    new version with a later ``valid_from`` replaces it from then on.
    """
    price = session.get(ModelPrice, price_id)
    if price is None:
        raise LookupError(f"no price version {price_id}")
    if price.valid_from <= (now or utcnow()):
        raise ValueError("this version is in effect already; add a new version instead")
    session.delete(price)
    session.flush()
    return price


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


def _insert(session: Session, table):
    return (postgresql.insert(table) if session.get_bind().dialect.name == "postgresql"
            else sqlite.insert(table))


ROLLED_UP = ("calls", "prompt_tokens", "cached_tokens", "completion_tokens", "cost")


@functools.cache
def _usage_insert():
    table = UsageRecord.__table__
    return insert(table).values(
        {c.name: bindparam(c.name, type_=c.type) for c in table.columns if c.name != "id"}
    ).returning(table.c.id)


@functools.cache
def _roll_up_statement(dialect: str):
    """The ``usage_daily`` upsert, built once per dialect with every value a parameter."""
    table = UsageDaily.__table__
    keys = ("day", "department", "user_hash", "model")
    stmt = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table).values(
        {name: bindparam(name, type_=table.c[name].type) for name in (*keys, *ROLLED_UP)})
    return stmt.on_conflict_do_update(
        index_elements=list(keys),
        set_={name: table.c[name] + stmt.excluded[name] for name in ROLLED_UP})


@functools.cache
def _lock_periods_statements(dialect: str, count: int):
    """The period rows' insert-if-missing and their locking select for ``count`` keys, built once
    per dialect and count; key ``i`` is the parameters ``b<i>`` (budget id) and ``s<i>`` (start)."""
    table = BudgetPeriod.__table__
    start_type = table.c.period_start.type
    keys = [(bindparam(f"b{i}"), bindparam(f"s{i}", type_=start_type)) for i in range(count)]
    zero = Decimal(0)
    insert = ((postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)
              .values([{"budget_id": b, "period_start": s, "spent": zero, "reserved": zero}
                       for b, s in keys])
              .on_conflict_do_nothing(index_elements=["budget_id", "period_start"]))
    query = (select(BudgetPeriod)
             .where(or_(*[and_(BudgetPeriod.budget_id == b, BudgetPeriod.period_start == s)
                          for b, s in keys]))
             .order_by(BudgetPeriod.budget_id)
             .execution_options(populate_existing=True))
    if dialect != "sqlite":
        query = query.with_for_update()
    return insert, query


def _lock_periods(session: Session, keys: list[tuple[int, datetime]]) -> dict:
    """Make sure the period rows exist and lock them, in budget-id order (no deadlocks).

    On SQLite the INSERT is a write, which takes the database's write lock for the rest of the
    transaction; on PostgreSQL ``FOR UPDATE`` locks exactly these rows.
    """
    keys = sorted(set(keys))
    if not keys:
        return {}
    insert, query = _lock_periods_statements(session.get_bind().dialect.name, len(keys))
    params = {}
    for i, (b, s) in enumerate(keys):
        params[f"b{i}"], params[f"s{i}"] = b, s
    session.execute(insert, params)
    return {(p.budget_id, p.period_start): p for p in session.scalars(query, params)}


@functools.cache
def _budgets_by_id():
    return select(Budget).where(Budget.id.in_(bindparam("ids", expanding=True)))


def _encode_periods(keys: list[tuple[int, datetime]]) -> str:
    return ",".join(f"{b}@{s.isoformat()}" for b, s in keys)


def _decode_periods(text: str) -> list[tuple[int, datetime]]:
    out = []
    for item in filter(None, text.split(",")):
        b, _, s = item.partition("@")
        out.append((int(b), datetime.fromisoformat(s)))
    return out


class Accounting:
    """Budget enforcement and usage recording over one ``Database``."""

    def __init__(self, db, tz: ZoneInfo, currency: str = "CNY", audit=None,
                 on_alerts: Callable[[list[RaisedAlert]], None] | None = None):
        self.db = db
        self.tz = tz
        self.currency = currency
        self.audit = audit
        self.on_alerts = on_alerts

    def reserve(self, user_hash: str, department: str, model: str, prompt_tokens: int,
                max_new_tokens: int, api_key_id: str | None = None,
                message_id: int | None = None, now: datetime | None = None,
                user_hashes: Sequence[str] = ()) -> Admission:
        """``user_hashes``: the user's blind index under the ring's other keys (their budgets apply)."""
        now = now or utcnow()
        base = {"user_hash": user_hash, "department": department, "api_key_id": api_key_id,
                "model": model, "message_id": message_id, "prompt_tokens": prompt_tokens}
        with self.db.transaction() as session:
            budgets = applicable_budgets(session, [user_hash, *user_hashes], department, api_key_id)
            if not budgets:
                return Admission(True, **base)
            worst = worst_case(price_for(session, model, now), prompt_tokens, max_new_tokens)
            keys = [(b.id, period_start(b.period, now, self.tz)) for b in budgets]
            periods = _lock_periods(session, keys)
            for budget, key in zip(budgets, keys, strict=True):
                row = periods[key]
                if budget.action == "block" and row.spent + row.reserved >= budget.limit:
                    return Admission(False, blocked_by=budget, spent=row.spent, **base)
            for key in keys:
                periods[key].reserved += worst
            reservation = BudgetReservation(amount=worst, periods=_encode_periods(keys),
                                            message_id=message_id, created_at=now)
            session.add(reservation)
            session.flush()
            return Admission(True, reservation.id, worst, **base)

    def release(self, admission: Admission | int | None) -> None:
        """Give back a reservation (the generation failed); safe to call twice."""
        reservation_id = admission.reservation_id if isinstance(admission, Admission) else admission
        if reservation_id is None:
            return
        with self.db.transaction() as session:
            self._drop_reservation(session, reservation_id)

    def _drop_reservation(self, session: Session, reservation_id: int):
        """Take a reservation off its periods' ``reserved``; its period keys, or None when it
        was gone already."""
        reservation = session.get(BudgetReservation, reservation_id)
        if reservation is None:
            return None
        keys = _decode_periods(reservation.periods)
        periods = _lock_periods(session, keys)
        # Re-read under the lock: a concurrent release may have taken it first.
        gone = session.execute(delete(BudgetReservation)
                               .where(BudgetReservation.id == reservation_id)).rowcount
        if not gone:
            return None
        for key in keys:
            row = periods[key]
            row.reserved = max(row.reserved - reservation.amount, Decimal(0))
        return keys

    def settle(self, admission: Admission | None, usage: Usage, now: datetime | None = None) -> Settled:
        """Record the call's usage and cost, and free its reservation, in one transaction.

        The tokens charged (and recorded) are the larger of the reported and the estimated
        counts, the prompt's estimate being the reservation's; the price is the configured
        model's (the admission's), whatever name the model server answered with.
        """
        now = now or utcnow()
        model = (admission.model if admission is not None and admission.model else usage.model)
        prompt_tokens = max(usage.prompt_tokens, usage.estimated_prompt_tokens,
                            admission.prompt_tokens if admission is not None else 0)
        completion_tokens = max(usage.completion_tokens, usage.estimated_completion_tokens)
        cached_tokens = min(max(usage.cached_tokens, 0), max(usage.prompt_tokens, 0))
        with self.db.transaction() as session:
            price = price_for(session, model, now)
            if price is None:
                log.warning("no price for model %r (nor %r): this call costs nothing", model,
                            FALLBACK_MODEL)
            cost = cost_of(price, prompt_tokens, cached_tokens, completion_tokens)
            record = {
                "created_at": now, "day": local_day(now, self.tz), "user_hash": usage.user_hash,
                "department": usage.department or "", "api_key_id": usage.api_key_id,
                "model": model[:64], "prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens,
                "completion_tokens": completion_tokens, "cost": cost,
                "currency": price.currency if price else self.currency,
                "price_id": price.id if price else None, "latency_ms": usage.latency_ms,
                "message_id": usage.message_id}
            # Core statements built once: the ORM's unit of work for one insert cost more.
            usage_id = session.execute(_usage_insert(), record).scalar_one()
            self._roll_up(session, record)

            keys = None
            if admission is not None and admission.reservation_id is not None:
                keys = self._drop_reservation(session, admission.reservation_id)
            if keys is None:  # no reservation (no budget then, or it expired): charge today's
                budgets = applicable_budgets(session, usage.user_hash, usage.department,
                                             usage.api_key_id)
                keys = [(b.id, period_start(b.period, now, self.tz)) for b in budgets]
            alerts = self._charge(session, keys, cost) if keys else []
            for alert in alerts:
                self._audit_alert(session, alert)
            session.flush()
            settled = Settled(usage_id, cost, alerts)
        if alerts and self.on_alerts is not None:
            self.on_alerts(alerts)
        return settled

    def _roll_up(self, session: Session, record: dict) -> None:
        session.execute(_roll_up_statement(session.get_bind().dialect.name),
                        {**{k: record[k] for k in ("day", "department", "user_hash", "model",
                                                   *ROLLED_UP[1:])}, "calls": 1})

    def _charge(self, session: Session, keys, cost: Decimal) -> list[RaisedAlert]:
        periods = _lock_periods(session, keys)
        budgets = {b.id: b for b in session.scalars(_budgets_by_id(),
                                                     {"ids": [k[0] for k in keys]})}
        alerts = []
        for key in sorted(periods):
            row, budget = periods[key], budgets.get(key[0])
            row.spent += cost
            if budget is None:
                continue
            for threshold in parse_thresholds(budget.thresholds):
                if row.spent * 100 < budget.limit * threshold:
                    break
                alert = self._raise_once(session, budget, row, threshold)
                if alert is not None:
                    alerts.append(alert)
        return alerts

    def _raise_once(self, session: Session, budget: Budget, row: BudgetPeriod,
                    threshold: int) -> RaisedAlert | None:
        stmt = _insert(session, BudgetAlert).values(
            budget_id=budget.id, period_start=row.period_start, threshold=threshold,
            spent=row.spent, limit=budget.limit, created_at=utcnow(),
        ).on_conflict_do_nothing(index_elements=["budget_id", "period_start", "threshold"])
        alert_id = session.scalar(stmt.returning(BudgetAlert.id))
        if alert_id is None:
            return None  # raised already, by this or another process
        return RaisedAlert(alert_id, budget.id, budget.scope, budget.scope_value, budget.period,
                           row.period_start, threshold, row.spent, budget.limit, budget.currency,
                           budget.action)

    def _audit_alert(self, session: Session, alert: RaisedAlert) -> None:
        if self.audit is not None:
            self.audit.append(session, EventType.BUDGET_ALERT, actor="system",
                              outcome=f"{alert.threshold}%", payload=alert.as_json())

    def expire_reservations(self, older_than_s: float, now: datetime | None = None) -> int:
        """Charge the worst case of reservations nobody settled (a worker killed mid-call, a
        charge that failed): spent, not released, so a failure is never a free call. Returns
        how many were charged."""
        cutoff = (now or utcnow()) - timedelta(seconds=older_than_s)
        with self.db.session() as session:
            stale = list(session.execute(select(BudgetReservation.id, BudgetReservation.amount)
                                         .where(BudgetReservation.created_at < cutoff)))
        charged = []
        for reservation_id, amount in stale:
            with self.db.transaction() as session:
                keys = self._drop_reservation(session, reservation_id)
                if keys is None:
                    continue  # settled or released meanwhile
                alerts = self._charge(session, keys, amount)
                for alert in alerts:
                    self._audit_alert(session, alert)
            log.warning("budget reservation %s expired unsettled: charged its worst case %s",
                        reservation_id, amount)
            charged.append(reservation_id)
            if alerts and self.on_alerts is not None:
                self.on_alerts(alerts)
        return len(charged)

    # -- reading -------------------------------------------------------------------------------
    def user_spend(self, session: Session, user_hash: str | Sequence[str], since: date) -> Decimal:
        """``user_hash`` may list the user's blind index under every key of the ring."""
        hashes = [user_hash] if isinstance(user_hash, str) else list(user_hash)
        total = session.scalar(select(func.sum(UsageDaily.cost)).where(
            UsageDaily.user_hash.in_(hashes), UsageDaily.day >= since))
        return total or Decimal(0)

    def budget_status(self, user_hash: str, department: str, api_key_id: str | None = None,
                      now: datetime | None = None, user_hashes: Sequence[str] = ()) -> list[dict]:
        """Each applicable budget with its spend in the current period."""
        now = now or utcnow()
        out = []
        with self.db.session() as session:
            for budget in applicable_budgets(session, [user_hash, *user_hashes], department,
                                             api_key_id):
                start = period_start(budget.period, now, self.tz)
                row = session.get(BudgetPeriod, (budget.id, start))
                spent = row.spent if row else Decimal(0)
                out.append({"budget": budget, "period_start": start, "spent": spent,
                            "remaining": max(budget.limit - spent, Decimal(0))})
        return out


def mark_delivered(db, alert_id: int, channels: list[str]) -> None:
    with db.transaction() as session:
        session.execute(update(BudgetAlert).where(BudgetAlert.id == alert_id)
                        .values(delivered=",".join(channels)[:64] or None))


# -- alert delivery ---------------------------------------------------------------------------------
SCOPE_NAMES = {"global": "公司 company", "department": "部门 department", "user": "个人 user",
               "api_key": "API key"}
PERIOD_NAMES = {"day": "今日 today", "week": "本周 this week", "month": "本月 this month"}


def alert_text(alert: RaisedAlert) -> str:
    who = SCOPE_NAMES.get(alert.scope, alert.scope)
    if alert.scope_value and alert.scope != "user":
        who += f" {alert.scope_value}"
    elif alert.scope == "user":
        who += f" {alert.scope_value[:12]}"
    verb = "已用完，新的提问将被拦截 (blocking)" if alert.threshold >= 100 and alert.action == "block" \
        else f"已达 {alert.threshold}%"
    return (f"AI 助手预算提醒 Budget alert: {who} {PERIOD_NAMES.get(alert.period, alert.period)} "
            f"{verb}: {alert.spent:.4f} / {alert.limit:.4f} {alert.currency}")


class AlertSender:
    """Sends alerts off the reply path: WeCom text to the admins, and the webhook (POST JSON)."""

    def __init__(self, wecom, recipients: list[str], webhook_url: str | None, timeout_s: float,
                 db=None, http_post=None):
        self.wecom = wecom
        self.recipients = recipients
        self.webhook_url = webhook_url
        self.timeout_s = timeout_s
        self.db = db
        if http_post is None:
            import requests

            http_post = requests.post
        self._post = http_post

    def __call__(self, alerts: list[RaisedAlert]) -> threading.Thread:
        thread = threading.Thread(target=self.deliver, args=(alerts,), daemon=True,
                                  name="budget-alerts")
        thread.start()
        return thread

    def deliver(self, alerts: list[RaisedAlert]) -> None:
        for alert in alerts:
            channels = []
            if self.recipients and self.wecom is not None:
                try:
                    self.wecom.send("|".join(self.recipients), "text", alert_text(alert))
                    channels.append("wecom")
                except Exception:  # noqa: BLE001 - the alert row is on the dashboard anyway
                    log.warning("budget alert %s not sent to WeCom", alert.alert_id)
            if self.webhook_url:
                try:
                    body = json.dumps(alert.as_json(), ensure_ascii=False).encode()
                    response = self._post(self.webhook_url, data=body, timeout=self.timeout_s,
                                          headers={"Content-Type": "application/json"})
                    if getattr(response, "status_code", 200) < 300:
                        channels.append("webhook")
                except Exception:  # noqa: BLE001 - same: never let delivery break anything
                    log.warning("budget alert %s not delivered to the webhook", alert.alert_id)
            if self.db is not None:
                try:
                    mark_delivered(self.db, alert.alert_id, channels)
                except Exception:  # noqa: BLE001
                    log.warning("could not record delivery of budget alert %s", alert.alert_id)
