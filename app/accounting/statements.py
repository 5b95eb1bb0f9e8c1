"""The ledger writer's SQL: usage rows and their daily rollup, budget period rows (locked,
changed in memory, written back), reservations, and the budgets a batch reads.

Statements are built once per shape (``functools.cache``): made per call, building them cost
the writer more CPU than running them. The usage rows and the rollup go through the driver's
cursor (``DriverStatements``) for the same reason.
"""

from __future__ import annotations

import functools
from datetime import datetime
from decimal import Decimal

from sqlalchemy import and_, bindparam, delete, insert, inspect, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from app.db import Money
from app.models import Budget, BudgetPeriod, BudgetReservation, BudgetScope, UsageDaily, UsageRecord
from app.outbox.statements import DriverStatements, values_rows

ROLLED_UP = ("calls", "prompt_tokens", "cached_tokens", "completion_tokens", "cost")
_USAGE_COLUMNS = ("created_at", "day", "user_hash", "department", "api_key_id", "model",
                  "prompt_tokens", "cached_tokens", "completion_tokens", "cost", "currency",
                  "price_id", "latency_ms", "message_id")
_ROLL_UP_KEYS = ("day", "department", "user_hash", "model")
_MONEY = Money()


def dialect_insert(conn: Connection, table):
    """An INSERT with ``on_conflict_*`` for the connection's dialect."""
    return postgresql.insert(table) if conn.dialect.name == "postgresql" else sqlite.insert(table)


# -- usage ------------------------------------------------------------------------------------------
def insert_usage(sql: DriverStatements, records: list[dict]) -> None:
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


def roll_up_usage(sql: DriverStatements, records: list[dict]) -> None:
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


# -- budget periods ---------------------------------------------------------------------------------
class PeriodRow:
    """A ``budget_periods`` row this transaction holds locked, changed in memory and written
    back by ``write_periods``."""

    __slots__ = ("budget_id", "period_start", "spent", "reserved", "_was")

    def __init__(self, budget_id: int, period_start: datetime, spent: Decimal, reserved: Decimal):
        self.budget_id, self.period_start = budget_id, period_start
        self.spent, self.reserved = spent, reserved
        self._was = (spent, reserved)

    @property
    def changed(self) -> bool:
        return (self.spent, self.reserved) != self._was


PeriodKey = tuple[int, datetime]  # (budget id, period start)


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


def lock_periods(conn: Connection, keys) -> dict[PeriodKey, PeriodRow]:
    """Make sure the period rows of ``keys`` exist and lock them, in key order (budget id,
    then start: every transaction locks them in the same order, so none deadlock)."""
    keys = sorted(set(keys))
    if not keys:
        return {}
    params = {}
    for i, (b, s) in enumerate(keys):
        params[f"b{i}"], params[f"s{i}"] = b, s
    stmt = _lock_periods_statement(conn.dialect.name, len(keys))
    return {(r.budget_id, r.period_start): PeriodRow(*r) for r in conn.execute(stmt, params)}


@functools.cache
def _write_periods_statement():
    table = BudgetPeriod.__table__
    return (update(table)
            .where(table.c.budget_id == bindparam("b"),
                   table.c.period_start == bindparam("s", type_=table.c.period_start.type))
            .values(spent=bindparam("new_spent", type_=table.c.spent.type),
                    reserved=bindparam("new_reserved", type_=table.c.reserved.type)))


def write_periods(conn: Connection, rows: dict[PeriodKey, PeriodRow]) -> None:
    """Write back the locked period rows that changed."""
    changed = [{"b": r.budget_id, "s": r.period_start, "new_spent": r.spent,
                "new_reserved": r.reserved} for _, r in sorted(rows.items()) if r.changed]
    if changed:
        conn.execute(_write_periods_statement(), changed)


def encode_periods(keys: list[PeriodKey]) -> str:
    """A reservation's periods as stored on its row (``budget_reservations.periods``)."""
    return ",".join(f"{b}@{s.isoformat()}" for b, s in keys)


def decode_periods(text: str) -> list[PeriodKey]:
    out = []
    for item in filter(None, text.split(",")):
        b, _, s = item.partition("@")
        out.append((int(b), datetime.fromisoformat(s)))
    return out


# -- reservations -----------------------------------------------------------------------------------
@functools.cache
def drop_reservations_statement():
    """Delete reservations, returning what each held: the one transaction that deletes a
    reservation is the one that takes it off its periods (a second release, or an expiry racing
    a settle, finds nothing)."""
    table = BudgetReservation.__table__
    return (delete(table).where(table.c.id.in_(bindparam("ids", expanding=True)))
            .returning(table.c.id, table.c.amount, table.c.periods))


@functools.cache
def reservation_insert():
    table = BudgetReservation.__table__
    return insert(table).returning(table.c.id, sort_by_parameter_order=True)


# -- budgets read by the writer -----------------------------------------------------------------------
def _budget_rows():
    """``budgets`` read on a Core connection, each column under its attribute's name (``limit``
    is the column ``limit_amount``): the rows answer as ``Budget`` objects do, without the ORM's
    session and identity map in the accounting writer."""
    return select(*(column.label(name) for name, column in inspect(Budget).columns.items()))


@functools.cache
def budgets_by_id():
    return _budget_rows().where(Budget.id.in_(bindparam("ids", expanding=True)))


@functools.cache
def batch_budgets_statement():
    """The enabled budgets of any of a batch's users, departments and API keys, and the global
    ones: one query per batch (``budget_applies`` sorts them out per call)."""
    return _budget_rows().where(Budget.enabled.is_(True), or_(
        Budget.scope == BudgetScope.GLOBAL,
        and_(Budget.scope == BudgetScope.USER,
             Budget.scope_value.in_(bindparam("hashes", expanding=True))),
        and_(Budget.scope == BudgetScope.DEPARTMENT,
             Budget.scope_value.in_(bindparam("departments", expanding=True))),
        and_(Budget.scope == BudgetScope.API_KEY,
             Budget.scope_value.in_(bindparam("api_keys", expanding=True))))).order_by(Budget.id)
