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
  applicable budget's period row, under a row lock (an upsert that takes it: PostgreSQL's row
  lock; SQLite's write lock); a budget whose spent + reserved has reached its limit refuses
  (``block``) or lets it pass (``warn``). ``settle`` turns the reservation into the real cost,
  ``release`` drops it (the generation failed). A request is admitted only while the budget is
  not exhausted, so concurrent requests overspend by at most one request's worst case.
- **Group commit**: ``reserve`` and ``settle`` calls of one process that wait together are
  written by one writer thread in one transaction, in order, each as it would be alone, with
  one lock of the period rows and one commit for all (``_GroupCommit``): a company-wide budget
  no longer serialises every call on its row, only every batch. Callers still return after
  their call committed; a failed batch is retried call by call.
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
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

from sqlalchemy import and_, bindparam, delete, func, insert, inspect, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from app import pg_liveness
from app.audit import Event, EventType
from app.db import Money, to_money, utcnow
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
from app.outbox.statements import DriverStatements, read_time, values_rows

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


def estimate_choice_tokens(choices: Iterable[str]) -> int:
    """An upper bound on the tokens a request's ``guided_choice`` replies cost the engine: each
    is tokenized and, scored by likelihood, prefilled whole after the prompt with its
    end-of-sequence token (``inference.engine.choice_scoring``); 64 replies of 300 characters
    took 23 times a plain answer's time and were charged as the 7 tokens of the prompt. Counted
    in either scoring mode, as prompt tokens: their UTF-8 bytes and one token each."""
    return sum(_utf8_len(c) + 1 for c in choices)


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


def _insert(conn: Connection, table):
    return postgresql.insert(table) if conn.dialect.name == "postgresql" else sqlite.insert(table)


ROLLED_UP = ("calls", "prompt_tokens", "cached_tokens", "completion_tokens", "cost")


_USAGE_COLUMNS = ("created_at", "day", "user_hash", "department", "api_key_id", "model",
                  "prompt_tokens", "cached_tokens", "completion_tokens", "cost", "currency",
                  "price_id", "latency_ms", "message_id")
_ROLL_UP_KEYS = ("day", "department", "user_hash", "model")
_MONEY = Money()


def _insert_usage(sql: DriverStatements, records: list[dict]) -> None:
    """The batch's ``usage_records`` rows in one statement, on the driver's cursor (through Core,
    its parameter and type machinery cost the accounting writer more CPU than the insert)."""
    params = []
    for r in records:
        params += [sql.time(r["created_at"]), sql.day(r["day"]), r["user_hash"], r["department"],
                   r["api_key_id"], r["model"], r["prompt_tokens"], r["cached_tokens"],
                   r["completion_tokens"], _MONEY.process_bind_param(r["cost"], None), r["currency"],
                   r["price_id"], r["latency_ms"], r["message_id"]]
    sql.execute(f"INSERT INTO {UsageRecord.__tablename__} ({', '.join(_USAGE_COLUMNS)}) "  # noqa: S608
                f"VALUES {values_rows(len(records), len(_USAGE_COLUMNS))}", params)


@functools.cache
def _roll_up_sql(rows: int) -> str:
    """The ``usage_daily`` upsert of ``rows`` keys (the same SQL on PostgreSQL and SQLite)."""
    table = UsageDaily.__tablename__
    columns = (*_ROLL_UP_KEYS, *ROLLED_UP)
    added = ", ".join(f"{name} = {table}.{name} + excluded.{name}" for name in ROLLED_UP)
    return (f"INSERT INTO {table} ({', '.join(columns)}) "  # noqa: S608
            f"VALUES {values_rows(rows, len(columns))} "
            f"ON CONFLICT ({', '.join(_ROLL_UP_KEYS)}) DO UPDATE SET {added}")


class _PeriodRow:
    """A ``budget_periods`` row this transaction holds locked, changed in memory and written
    back by ``_write_periods``."""

    __slots__ = ("budget_id", "period_start", "spent", "reserved", "_was")

    def __init__(self, budget_id: int, period_start: datetime, spent: Decimal, reserved: Decimal):
        self.budget_id, self.period_start = budget_id, period_start
        self.spent, self.reserved = spent, reserved
        self._was = (spent, reserved)

    @property
    def changed(self) -> bool:
        return (self.spent, self.reserved) != self._was


@functools.cache
def _lock_periods_statement(dialect: str, count: int):
    """Insert-if-missing and lock ``count`` period rows in one statement, returning them: an
    upsert whose update changes nothing still takes the row's lock (PostgreSQL waits for its
    holder and returns the row as that one committed it; SQLite holds the write lock already).
    Built once per dialect and count; key ``i`` is the parameters ``b<i>`` and ``s<i>``."""
    table = BudgetPeriod.__table__
    start_type = table.c.period_start.type
    zero = Decimal(0)
    stmt = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table).values(
        [{"budget_id": bindparam(f"b{i}"), "period_start": bindparam(f"s{i}", type_=start_type),
          "spent": zero, "reserved": zero} for i in range(count)])
    return stmt.on_conflict_do_update(
        index_elements=["budget_id", "period_start"], set_={"spent": table.c.spent},
    ).returning(table.c.budget_id, table.c.period_start, table.c.spent, table.c.reserved)


def _lock_periods(conn: Connection, keys) -> dict[tuple[int, datetime], _PeriodRow]:
    """Make sure the period rows of ``keys`` exist and lock them, in key order (budget id,
    then start: every transaction locks them in the same order, so none deadlock)."""
    keys = sorted(set(keys))
    if not keys:
        return {}
    params = {}
    for i, (b, s) in enumerate(keys):
        params[f"b{i}"], params[f"s{i}"] = b, s
    stmt = _lock_periods_statement(conn.dialect.name, len(keys))
    return {(r.budget_id, r.period_start): _PeriodRow(*r) for r in conn.execute(stmt, params)}


@functools.cache
def _write_periods_statement():
    table = BudgetPeriod.__table__
    return (update(table)
            .where(table.c.budget_id == bindparam("b"),
                   table.c.period_start == bindparam("s", type_=table.c.period_start.type))
            .values(spent=bindparam("new_spent", type_=table.c.spent.type),
                    reserved=bindparam("new_reserved", type_=table.c.reserved.type)))


def _write_periods(conn: Connection, rows: dict) -> None:
    changed = [{"b": r.budget_id, "s": r.period_start, "new_spent": r.spent,
                "new_reserved": r.reserved} for _, r in sorted(rows.items()) if r.changed]
    if changed:
        conn.execute(_write_periods_statement(), changed)


def _budget_rows():
    """``budgets`` read on a Core connection, each column under its attribute's name (``limit``
    is the column ``limit_amount``): the rows answer as ``Budget`` objects do, without the ORM's
    session and identity map in the accounting writer."""
    return select(*(column.label(name) for name, column in inspect(Budget).columns.items()))


@functools.cache
def _budgets_by_id():
    return _budget_rows().where(Budget.id.in_(bindparam("ids", expanding=True)))


@functools.cache
def _drop_reservations_statement():
    """Delete reservations, returning what each held: the one transaction that deletes a
    reservation is the one that takes it off its periods (a second release, or an expiry racing
    a settle, finds nothing)."""
    table = BudgetReservation.__table__
    return (delete(table).where(table.c.id.in_(bindparam("ids", expanding=True)))
            .returning(table.c.id, table.c.amount, table.c.periods))


@functools.cache
def _reservation_insert():
    table = BudgetReservation.__table__
    return insert(table).returning(table.c.id, sort_by_parameter_order=True)


@functools.cache
def _batch_budgets_statement():
    """The enabled budgets of any of a batch's users, departments and API keys, and the global
    ones: one query per batch (``_applies`` sorts them out per call)."""
    return _budget_rows().where(Budget.enabled.is_(True), or_(
        Budget.scope == BudgetScope.GLOBAL,
        and_(Budget.scope == BudgetScope.USER,
             Budget.scope_value.in_(bindparam("hashes", expanding=True))),
        and_(Budget.scope == BudgetScope.DEPARTMENT,
             Budget.scope_value.in_(bindparam("departments", expanding=True))),
        and_(Budget.scope == BudgetScope.API_KEY,
             Budget.scope_value.in_(bindparam("api_keys", expanding=True))))).order_by(Budget.id)


def _applies(budget: Budget, hashes: Sequence[str], department: str, api_key_id: str | None) -> bool:
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


class _Price(NamedTuple):
    """A ``model_prices`` row (the attributes ``cost_of`` and ``worst_case`` read)."""

    id: int
    model: str
    input_per_m: Decimal
    cached_input_per_m: Decimal
    output_per_m: Decimal
    currency: str
    valid_from: datetime


@functools.cache
def _prices_sql(models: int) -> str:
    return ("SELECT id, model, input_per_m, cached_input_per_m, output_per_m, currency, valid_from "  # noqa: S608
            f"FROM {ModelPrice.__tablename__} WHERE model IN ({', '.join('?' * models)}) "
            "ORDER BY valid_from DESC, id DESC")


def _alert_event(alert: RaisedAlert) -> Event:
    return Event(EventType.BUDGET_ALERT, actor="system", outcome=f"{alert.threshold}%",
                 payload=alert.as_json())


class _Prices:
    """Every price version of a batch's models and of the fallback (``*``), read once; ``at``
    is the price in effect for one call: the model's latest version by then, else the fallback's."""

    def __init__(self, sql: DriverStatements, models: set[str]):
        self.versions: dict[str, list[_Price]] = {}
        if models:
            names = sorted(models | {FALLBACK_MODEL})
            money = _MONEY.process_result_value
            for id_, model, input_m, cached_m, output_m, currency, valid_from in sql.execute(
                    _prices_sql(len(names)), names):
                self.versions.setdefault(model, []).append(_Price(
                    id_, model, money(input_m, None), money(cached_m, None), money(output_m, None),
                    currency, read_time(valid_from)))

    def at(self, model: str, at: datetime):
        for name in (model, FALLBACK_MODEL):
            for price in self.versions.get(name, ()):
                if price.valid_from <= at:
                    return price
        return None


def _encode_periods(keys: list[tuple[int, datetime]]) -> str:
    return ",".join(f"{b}@{s.isoformat()}" for b, s in keys)


def _decode_periods(text: str) -> list[tuple[int, datetime]]:
    out = []
    for item in filter(None, text.split(",")):
        b, _, s = item.partition("@")
        out.append((int(b), datetime.fromisoformat(s)))
    return out


class _Job:
    """One ``reserve``, ``settle`` or ``audit`` waiting for the writer: its arguments, then its
    outcome."""

    __slots__ = ("kind", "args", "done", "result", "error", "thread")

    def __init__(self, kind: str, args):
        self.kind, self.args = kind, args
        self.thread = threading.get_ident()
        self.done = threading.Event()
        self.result = self.error = None

    def finish(self, result=None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


@dataclass
class _ReserveArgs:
    hashes: list[str]
    department: str
    api_key_id: str | None
    model: str
    prompt_tokens: int
    max_new_tokens: int
    now: datetime
    base: dict


@dataclass
class _SettleArgs:
    reservation_id: int | None
    usage: Usage
    model: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    now: datetime
    budgeted: bool = True


_FORK_GUARD = threading.Lock()
if hasattr(os, "register_at_fork"):  # a lock held by another thread at fork stays held in the child
    def _new_fork_guard():
        global _FORK_GUARD
        _FORK_GUARD = threading.Lock()

    os.register_at_fork(after_in_child=_new_fork_guard)


class _GroupCommit:
    """The process's accounting writer: every ``reserve`` and ``settle`` waiting when it is free
    goes into one transaction (up to ``MAX_BATCH``), so the period rows are locked and written,
    and the transaction committed, once per batch instead of once per call. Callers wait for
    their batch's commit, as they waited for their own transaction before. The thread starts
    with the first call (and again in a forked child) and ends after ``IDLE_S`` without work.

    Callers come back together: the calls of a batch return at once and many call again (a
    reserve's settle, the next message) while the next batch is being written, which then holds
    the quickest of them and the rest wait a whole batch more (the callers split into cohorts
    that take turns, each batch half as full as it could be). So the writer lingers up to
    ``LINGER_S`` after a batch for the threads it answered to come back (or 256 calls). A call
    that comes within those 2 ms of a batch whose threads do not come back (a reserve's thread
    goes on to generate) waits the rest of them; one that comes later, or alone after its own
    call, does not wait.
    """

    MAX_BATCH = 256
    IDLE_S = 2.0
    LINGER_S = 0.002

    def __init__(self, commit: Callable[[list[_Job]], None], idle: Callable[[], None]):
        self._commit = commit
        self._idle = idle  # called by the thread as it ends
        self._pid = 0
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._jobs: list[_Job] = []
        self._running = False
        self._pid = os.getpid()

    def run(self, kind: str, args):
        if self._pid != os.getpid():
            with _FORK_GUARD:
                if self._pid != os.getpid():
                    self._reset()
        job = _Job(kind, args)
        with self._cond:
            self._jobs.append(job)
            if self._running:
                self._cond.notify()
            else:
                self._running = True
                threading.Thread(target=self._loop, daemon=True, name="accounting-writer").start()
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def _loop(self) -> None:
        answered, until = set(), 0.0  # the last batch's threads, and how long to wait for them
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait(self.IDLE_S)
                    if not self._jobs:
                        # Idle: the connection goes back to the pool, under the lock, so the
                        # thread that the next call starts never finds it half given back.
                        try:
                            self._idle()
                        except Exception:  # noqa: BLE001 - the next thread connects afresh
                            log.exception("accounting writer: could not give its connection back")
                        self._running = False
                        return
                while ((left := until - time.monotonic()) > 0 and len(self._jobs) < self.MAX_BATCH
                       and answered - {job.thread for job in self._jobs}):
                    self._cond.wait(left)
                batch, self._jobs = self._jobs[:self.MAX_BATCH], self._jobs[self.MAX_BATCH:]
            try:
                self._commit(batch)
            except BaseException as exc:  # noqa: BLE001 - never leave a caller waiting
                for job in batch:
                    if not job.done.is_set():
                        job.finish(error=exc)
            answered = {job.thread for job in batch}
            until = time.monotonic() + self.LINGER_S


class Accounting:
    """Budget enforcement and usage recording over one ``Database``.

    ``reserve`` and ``settle`` go through the process's group commit (``_GroupCommit``): the
    calls waiting together are applied in order, one after the other, in one transaction, each
    exactly as it would be alone (so admission still sees every earlier call's reservation and
    charge), with one lock of the period rows, one insert of the usage rows, one upsert of the
    rollups and one commit for all of them. A batch that fails is retried one call at a time,
    so a bad call fails only itself.
    """

    def __init__(self, db, tz: ZoneInfo, currency: str = "CNY", audit=None,
                 on_alerts: Callable[[list[RaisedAlert]], None] | None = None):
        self.db = db
        self.tz = tz
        self.currency = currency
        self.audit = audit
        self.on_alerts = on_alerts
        self._writer = _GroupCommit(self._commit, self._give_back)
        # The writer's connection, held while calls keep coming (no checkout per batch; checked
        # as a checkout would before each) and given back to the pool when the writer thread
        # ends after ``IDLE_S`` without calls. The writer thread's only.
        self._connection = None
        self._connection_pid = 0
        self._alerts_raised: set[tuple] = set()  # (budget, period start, threshold) committed

    def reserve(self, user_hash: str, department: str, model: str, prompt_tokens: int,
                max_new_tokens: int, api_key_id: str | None = None,
                message_id: int | None = None, now: datetime | None = None,
                user_hashes: Sequence[str] = ()) -> Admission:
        """``user_hashes``: the user's blind index under the ring's other keys (their budgets apply)."""
        now = now or utcnow()
        base = {"user_hash": user_hash, "department": department, "api_key_id": api_key_id,
                "model": model, "message_id": message_id, "prompt_tokens": prompt_tokens}
        return self._run("reserve", _ReserveArgs(
            [user_hash, *user_hashes], department, api_key_id, model, prompt_tokens,
            max_new_tokens, now, base))

    def release(self, admission: Admission | int | None) -> None:
        """Give back a reservation (the generation failed); safe to call twice."""
        reservation_id = admission.reservation_id if isinstance(admission, Admission) else admission
        if reservation_id is None:
            return
        with self.db.transaction() as session:
            conn = session.connection()
            dropped = self._drop_reservation(conn, reservation_id)
            if dropped is not None:
                _write_periods(conn, dropped[1])

    def _drop_reservation(self, conn: Connection, reservation_id: int):
        """Delete a reservation and take it off its periods' ``reserved``: (its amount, its
        locked period rows), or None when it was gone already (released, settled, expired)."""
        held = conn.execute(_drop_reservations_statement(), {"ids": [reservation_id]}).first()
        if held is None:
            return None
        periods = _lock_periods(conn, _decode_periods(held.periods))
        for row in periods.values():
            row.reserved = max(row.reserved - held.amount, Decimal(0))
        return held.amount, periods

    def settle(self, admission: Admission | None, usage: Usage, now: datetime | None = None) -> Settled:
        """Record the call's usage and cost, and free its reservation, in one transaction.

        The tokens charged (and recorded) are the larger of the reported and the estimated
        counts, the prompt's estimate being the reservation's; the price is the configured
        model's (the admission's), whatever name the model server answered with.
        """
        model = (admission.model if admission is not None and admission.model else usage.model)
        settled = self._run("settle", _SettleArgs(
            admission.reservation_id if admission is not None else None, usage, model,
            max(usage.prompt_tokens, usage.estimated_prompt_tokens,
                admission.prompt_tokens if admission is not None else 0),
            min(max(usage.cached_tokens, 0), max(usage.prompt_tokens, 0)),
            max(usage.completion_tokens, usage.estimated_completion_tokens),
            now or utcnow(), admission is None or admission.budgeted))
        if settled.alerts and self.on_alerts is not None:
            self.on_alerts(settled.alerts)
        return settled

    def record_audit(self, event: Event) -> None:
        """Append ``event`` to the audit chain in the group commit's next transaction.

        The worker's reply events go here: each would otherwise be a transaction of its own
        (a connection checked out and pinged, three statements, a commit) after its message's;
        in the batch they share its commit and one move of the audit head. Returns when it is
        committed, as ``AuditLog.record`` does; the writer copies the head out
        (``AuditLog.publish_head``) once per batch."""
        if self.audit is None:
            raise RuntimeError("Accounting.record_audit: this Accounting was made without an AuditLog")
        self._run("audit", event)

    # -- the group commit ----------------------------------------------------------------------
    def _run(self, kind: str, args):
        queue = getattr(self.db.engine, "writer_queue", None)
        if queue is not None and getattr(queue, "_owner_thread", None) == threading.get_ident():
            # SQLite: the writer would wait for this thread's transaction, this thread for it.
            raise RuntimeError(f"Accounting.{kind} called inside a write transaction of this "
                               "thread on SQLite: it would wait for itself")
        return self._writer.run(kind, args)

    def _commit(self, jobs: list[_Job]) -> None:
        """Apply ``jobs`` in one transaction; when that fails, each alone (unless the
        connection was lost: then whether it committed is unknown, and all of them fail)."""
        seen: set[tuple] = set()
        try:
            if (self._connection is not None and self._connection_pid == os.getpid()
                    and not pg_liveness.still_open(self._connection)):
                self._give_back()  # closed while held (a server restart): as the pool would
            if self._connection is None or self._connection_pid != os.getpid():
                # (a forked child never touches its parent's connection: it takes its own)
                self._connection, self._connection_pid = self.db.engine.connect(), os.getpid()
            with self._connection.begin():
                results = self._apply(self._connection, jobs, seen)
        except Exception as exc:  # noqa: BLE001 - handed to the callers
            lost = isinstance(exc, DBAPIError) and exc.connection_invalidated
            if self._connection is not None and self._connection.invalidated:
                self._give_back()
            if len(jobs) == 1 or lost:
                for job in jobs:
                    job.finish(error=exc)
            else:
                for job in jobs:
                    self._commit([job])
            return
        self._alerts_raised |= seen
        for job, result in zip(jobs, results, strict=True):
            job.finish(result)
        if self.audit is not None and any(job.kind == "audit" for job in jobs):
            try:  # once a batch, after its callers went on; committed already, so only logged
                self.audit.publish_head(self.db)
            except Exception:  # noqa: BLE001 - 'audit verify' reports a copy behind the chain
                log.exception("accounting writer: the audit head was not copied out")

    def _give_back(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def _apply(self, conn: Connection, jobs: list[_Job], seen: set[tuple]) -> list:
        """The batch's work, in the lock order (usage rollup rows, reservation rows, period
        rows, audit head)."""
        settles = [job.args for job in jobs if job.kind == "settle"]
        reserves = [job.args for job in jobs if job.kind == "reserve"]
        events: list[Event] = []  # appended last: the audit head is the last lock taken
        # Reads: the budgets that apply, the prices.
        budgets = []
        if reserves or any(s.budgeted for s in settles):
            budgets = list(conn.execute(_batch_budgets_statement(), {
                "hashes": sorted({h for r in reserves for h in r.hashes}
                                 | {s.usage.user_hash for s in settles}),
                "departments": sorted({r.department for r in reserves if r.department}
                                      | {s.usage.department for s in settles if s.usage.department}),
                "api_keys": sorted({r.api_key_id for r in reserves if r.api_key_id}
                                   | {s.usage.api_key_id for s in settles if s.usage.api_key_id})}))
        sql = DriverStatements(conn)
        prices = _Prices(sql, {a.model for a in (*reserves, *settles)})

        # Each call's own figures, from those reads alone.
        records, plans = [], []
        for job in jobs:
            a = job.args
            if job.kind == "audit":
                plans.append(None)
            elif job.kind == "settle":
                price = prices.at(a.model, a.now)
                if price is None:
                    log.warning("no price for model %r (nor %r): this call costs nothing",
                                a.model, FALLBACK_MODEL)
                cost = cost_of(price, a.prompt_tokens, a.cached_tokens, a.completion_tokens)
                u = a.usage
                records.append({
                    "created_at": a.now, "day": local_day(a.now, self.tz),
                    "user_hash": u.user_hash, "department": u.department or "",
                    "api_key_id": u.api_key_id, "model": a.model[:64],
                    "prompt_tokens": a.prompt_tokens, "cached_tokens": a.cached_tokens,
                    "completion_tokens": a.completion_tokens, "cost": cost,
                    "currency": price.currency if price else self.currency,
                    "price_id": price.id if price else None, "latency_ms": u.latency_ms,
                    "message_id": u.message_id})
                fallback = [(b.id, period_start(b.period, a.now, self.tz)) for b in budgets
                            if a.budgeted and _applies(b, (u.user_hash,), u.department, u.api_key_id)]
                plans.append((cost, fallback))
            else:
                mine = [b for b in budgets if _applies(b, a.hashes, a.department, a.api_key_id)]
                worst = (worst_case(prices.at(a.model, a.now), a.prompt_tokens, a.max_new_tokens)
                         if mine else Decimal(0))
                plans.append((mine, worst, [(b.id, period_start(b.period, a.now, self.tz))
                                            for b in mine]))

        # Writes: usage rows and rollups first; then the reservations settled, deleted (one a
        # concurrent release or expiry took first is gone: its call is charged as if it had
        # none); then the period rows, locked once.
        if records:
            _insert_usage(sql, records)
            self._roll_up(sql, records)
        ids = sorted({s.reservation_id for s in settles if s.reservation_id is not None})
        dropped = {}
        if ids:
            dropped = {r.id: (r.amount, _decode_periods(r.periods))
                       for r in conn.execute(_drop_reservations_statement(), {"ids": ids})}
        keys = set()
        for job, plan in zip(jobs, plans, strict=True):
            if job.kind == "audit":
                continue
            if job.kind == "reserve":
                keys.update(plan[2])
            elif job.args.reservation_id in dropped:
                keys.update(dropped[job.args.reservation_id][1])
            else:
                keys.update(plan[1])
        rows = _lock_periods(conn, keys)
        by_id = {b.id: b for b in budgets}
        unknown = {k[0] for k in rows} - by_id.keys()
        if unknown:  # disabled since the reservation, still charged
            by_id.update((b.id, b) for b in conn.execute(_budgets_by_id(), {"ids": sorted(unknown)}))

        # Each call in turn, as if alone.
        results, new_reservations = [], []
        for job, plan in zip(jobs, plans, strict=True):
            a = job.args
            if job.kind == "audit":
                events.append(a)
                results.append(None)
                continue
            if job.kind == "settle":
                cost, fallback = plan
                own = dropped.pop(a.reservation_id, None)
                if own is not None:
                    amount, charged = own
                    for key in charged:
                        rows[key].reserved = max(rows[key].reserved - amount, Decimal(0))
                else:
                    charged = fallback
                alerts = self._charge_rows(conn, rows, by_id, charged, cost, seen)
                events.extend(_alert_event(alert) for alert in alerts)
                results.append(Settled(cost, alerts))
                continue
            mine, worst, their_keys = plan
            if not mine:
                results.append(Admission(True, **a.base))
                continue
            blocked = next((b for b, key in zip(mine, their_keys, strict=True)
                            if b.action == "block"
                            and rows[key].spent + rows[key].reserved >= b.limit), None)
            if blocked is not None:
                spent = rows[(blocked.id, period_start(blocked.period, a.now, self.tz))].spent
                results.append(Admission(False, blocked_by=blocked, spent=spent, **a.base))
                continue
            for key in their_keys:
                rows[key].reserved += worst
            new_reservations.append((len(results), {
                "amount": worst, "periods": _encode_periods(their_keys),
                "message_id": a.base["message_id"], "created_at": a.now}))
            results.append(None)
        if new_reservations:
            reservation_ids = conn.execute(_reservation_insert(),
                                           [r for _, r in new_reservations]).scalars()
            for (index, row), reservation_id in zip(new_reservations, reservation_ids, strict=True):
                results[index] = Admission(True, reservation_id, row["amount"],
                                           **jobs[index].args.base)
        _write_periods(conn, rows)
        if events and self.audit is not None:
            self.audit.append_many(conn, events)
        return results

    def _roll_up(self, sql: DriverStatements, records: list[dict]) -> None:
        """The batch's ``usage_daily`` upsert: one row per key (a statement may not change a row
        twice), in key order (two batches lock the rows they share in the same order)."""
        totals: dict[tuple, list] = {}
        for r in records:
            key = (r["day"], r["department"], r["user_hash"], r["model"])
            total = totals.get(key)
            if total is None:
                totals[key] = [1, *(r[name] for name in ROLLED_UP[1:])]
            else:
                total[0] += 1
                for i, name in enumerate(ROLLED_UP[1:], start=1):
                    total[i] += r[name]
        params = []
        for key in sorted(totals):
            *counts, cost = totals[key]
            params += [sql.day(key[0]), *key[1:], *counts, _MONEY.process_bind_param(cost, None)]
        sql.execute(_roll_up_sql(len(totals)), params)

    def _charge_rows(self, conn: Connection, periods: dict, budgets: dict, keys, cost: Decimal,
                     seen: set[tuple]) -> list[RaisedAlert]:
        """Add ``cost`` to the locked period rows of ``keys``; the threshold alerts it raises."""
        alerts = []
        for key in sorted(set(keys)):
            row, budget = periods[key], budgets.get(key[0])
            row.spent += cost
            if budget is None:
                continue
            for threshold in parse_thresholds(budget.thresholds):
                if row.spent * 100 < budget.limit * threshold:
                    break
                once = (budget.id, row.period_start, threshold)
                if once in self._alerts_raised or once in seen:
                    continue  # raised already (committed, or earlier in this batch)
                seen.add(once)
                alert = self._raise_once(conn, budget, row, threshold)
                if alert is not None:
                    alerts.append(alert)
        return alerts

    def _raise_once(self, conn: Connection, budget, row: _PeriodRow,
                    threshold: int) -> RaisedAlert | None:
        stmt = _insert(conn, BudgetAlert).values(
            budget_id=budget.id, period_start=row.period_start, threshold=threshold,
            spent=row.spent, limit=budget.limit, created_at=utcnow(),
        ).on_conflict_do_nothing(index_elements=["budget_id", "period_start", "threshold"])
        alert_id = conn.scalar(stmt.returning(BudgetAlert.id))
        if alert_id is None:
            return None  # raised already, by this or another process
        return RaisedAlert(alert_id, budget.id, budget.scope, budget.scope_value, budget.period,
                           row.period_start, threshold, row.spent, budget.limit, budget.currency,
                           budget.action)

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
                conn = session.connection()
                dropped = self._drop_reservation(conn, reservation_id)
                if dropped is None:
                    continue  # settled or released meanwhile
                periods = dropped[1]
                budgets = {b.id: b for b in conn.execute(
                    _budgets_by_id(), {"ids": sorted({k[0] for k in periods})})}
                alerts = self._charge_rows(conn, periods, budgets, periods, amount, set())
                _write_periods(conn, periods)
                if alerts and self.audit is not None:
                    self.audit.append_many(conn, [_alert_event(alert) for alert in alerts])
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
