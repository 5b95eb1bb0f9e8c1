"""One batch of the ledger writer: the calls that waited together, in one transaction.

The calls are applied in order, each exactly as it would be alone (admission still sees every
earlier call's reservation and charge), with one read of the budgets and prices, one insert of
the usage rows, one upsert of the rollups, one lock of the period rows and one append to the
audit chain. The steps run in the lock order: usage rollup rows, reservation rows, period rows,
audit head.

- ``reserve`` holds the call's worst case (prompt estimate x input price + max_new_tokens x
  output price) on every applicable budget's period row; a ``block`` budget whose spent +
  reserved has reached its limit refuses it. A request is admitted only while the budget is not
  exhausted, so concurrent requests overspend by at most one request's worst case.
- ``settle`` records the usage, takes its reservation off the period rows and charges the real
  cost; a threshold it crosses raises an alert (once per budget, period and threshold).
- ``audit`` appends an event to the chain in the same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import NamedTuple
from zoneinfo import ZoneInfo

from sqlalchemy.engine import Connection

from app.accounting.alerts import RaisedAlert, alert_event
from app.accounting.budgets import Admission, Settled, Usage, budget_applies, parse_thresholds
from app.accounting.group_commit import Job
from app.accounting.periods import local_day, period_start
from app.accounting.prices import FALLBACK_MODEL, PriceBook, cost_of, worst_case
from app.accounting.statements import (
    PeriodKey,
    PeriodRow,
    batch_budgets_statement,
    budgets_by_id,
    decode_periods,
    dialect_insert,
    drop_reservations_statement,
    encode_periods,
    insert_usage,
    lock_periods,
    reservation_insert,
    roll_up_usage,
    write_periods,
)
from app.audit.chain import Event
from app.db import utcnow
from app.models import BudgetAlert
from app.outbox.statements import DriverStatements

log = logging.getLogger(__name__)


@dataclass
class ReserveArgs:
    hashes: list[str]
    department: str
    api_key_id: str | None
    model: str
    prompt_tokens: int
    max_new_tokens: int
    now: datetime
    base: dict  # the Admission's fields that come from the call


@dataclass
class SettleArgs:
    reservation_id: int | None
    usage: Usage
    model: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    now: datetime
    budgeted: bool = True


class SettlePlan(NamedTuple):
    cost: Decimal
    fallback: list[PeriodKey]  # charged when the call's reservation is gone (or it had none)


class ReservePlan(NamedTuple):
    budgets: list  # the budgets that apply, in id order
    worst: Decimal
    keys: list[PeriodKey]  # their current periods, in the same order


class Batch:
    def __init__(self, conn: Connection, jobs: list[Job], *, tz: ZoneInfo, currency: str,
                 audit=None, raised: set[tuple] = frozenset(), seen: set[tuple] | None = None):
        self.conn, self.jobs = conn, jobs
        self.tz, self.currency, self.audit = tz, currency, audit
        self.raised = raised  # alerts committed already: (budget, period start, threshold)
        self.seen = set() if seen is None else seen  # alerts this transaction raised
        self.sql = DriverStatements(conn)
        self.events: list[Event] = []  # appended last: the audit head is the last lock taken

    def apply(self) -> list:
        """Each job's result (an ``Admission``, a ``Settled`` or None for an audit event)."""
        settles = [job.args for job in self.jobs if job.kind == "settle"]
        reserves = [job.args for job in self.jobs if job.kind == "reserve"]
        budgets = self._read_budgets(reserves, settles)
        prices = PriceBook(self.sql, {a.model for a in (*reserves, *settles)})
        plans, records = self._plan(budgets, prices)
        if records:
            insert_usage(self.sql, records)
            roll_up_usage(self.sql, records)
        dropped = self._drop_reservations(settles)
        rows = lock_periods(self.conn, self._period_keys(plans, dropped))
        by_id = self._budgets_by_id(budgets, rows)
        results, pending = self._each_call(plans, rows, by_id, dropped)
        self._insert_reservations(pending, results)
        write_periods(self.conn, rows)
        if self.events and self.audit is not None:
            self.audit.append_many(self.conn, self.events)
        return results

    # -- reads ---------------------------------------------------------------------------------
    def _read_budgets(self, reserves: list[ReserveArgs], settles: list[SettleArgs]) -> list:
        """The enabled budgets of the batch's users, departments and API keys (none read when
        no call is budgeted)."""
        if not reserves and not any(s.budgeted for s in settles):
            return []
        return list(self.conn.execute(batch_budgets_statement(), {
            "hashes": sorted({h for r in reserves for h in r.hashes}
                             | {s.usage.user_hash for s in settles}),
            "departments": sorted({r.department for r in reserves if r.department}
                                  | {s.usage.department for s in settles if s.usage.department}),
            "api_keys": sorted({r.api_key_id for r in reserves if r.api_key_id}
                               | {s.usage.api_key_id for s in settles if s.usage.api_key_id})}))

    def _plan(self, budgets: list, prices: PriceBook) -> tuple[list, list[dict]]:
        """Each call's own figures, from the reads alone: a plan per job, and the usage rows."""
        plans, records = [], []
        for job in self.jobs:
            if job.kind == "settle":
                plan, record = self._plan_settle(job.args, budgets, prices)
                records.append(record)
            elif job.kind == "reserve":
                plan = self._plan_reserve(job.args, budgets, prices)
            else:
                plan = None
            plans.append(plan)
        return plans, records

    def _plan_settle(self, a: SettleArgs, budgets: list,
                     prices: PriceBook) -> tuple[SettlePlan, dict]:
        price = prices.at(a.model, a.now)
        if price is None:
            log.warning("no price for model %r (nor %r): this call costs nothing",
                        a.model, FALLBACK_MODEL)
        cost = cost_of(price, a.prompt_tokens, a.cached_tokens, a.completion_tokens)
        u = a.usage
        record = {
            "created_at": a.now, "day": local_day(a.now, self.tz),
            "user_hash": u.user_hash, "department": u.department or "",
            "api_key_id": u.api_key_id, "model": a.model[:64],
            "prompt_tokens": a.prompt_tokens, "cached_tokens": a.cached_tokens,
            "completion_tokens": a.completion_tokens, "cost": cost,
            "currency": price.currency if price else self.currency,
            "price_id": price.id if price else None, "latency_ms": u.latency_ms,
            "message_id": u.message_id}
        fallback = [(b.id, period_start(b.period, a.now, self.tz)) for b in budgets
                    if a.budgeted and budget_applies(b, (u.user_hash,), u.department, u.api_key_id)]
        return SettlePlan(cost, fallback), record

    def _plan_reserve(self, a: ReserveArgs, budgets: list, prices: PriceBook) -> ReservePlan:
        mine = [b for b in budgets if budget_applies(b, a.hashes, a.department, a.api_key_id)]
        worst = (worst_case(prices.at(a.model, a.now), a.prompt_tokens, a.max_new_tokens)
                 if mine else Decimal(0))
        return ReservePlan(mine, worst, [(b.id, period_start(b.period, a.now, self.tz))
                                         for b in mine])

    # -- writes --------------------------------------------------------------------------------
    def _drop_reservations(self, settles: list[SettleArgs]) -> dict[int, tuple]:
        """Delete the settled calls' reservations: {id: (amount, its period keys)}. One a
        concurrent release or expiry took first is gone: its call is charged as if it had none."""
        ids = sorted({s.reservation_id for s in settles if s.reservation_id is not None})
        if not ids:
            return {}
        return {r.id: (r.amount, decode_periods(r.periods))
                for r in self.conn.execute(drop_reservations_statement(), {"ids": ids})}

    def _period_keys(self, plans: list, dropped: dict) -> set[PeriodKey]:
        """Every period row the batch changes (locked once, together)."""
        keys = set()
        for job, plan in zip(self.jobs, plans, strict=True):
            if job.kind == "reserve":
                keys.update(plan.keys)
            elif job.kind == "settle":
                own = dropped.get(job.args.reservation_id)
                keys.update(own[1] if own is not None else plan.fallback)
        return keys

    def _budgets_by_id(self, budgets: list, rows: dict) -> dict:
        """The budgets of the locked rows, with those disabled since a reservation (still
        charged) read by id."""
        by_id = {b.id: b for b in budgets}
        unknown = {k[0] for k in rows} - by_id.keys()
        if unknown:
            by_id.update((b.id, b) for b in self.conn.execute(budgets_by_id(),
                                                              {"ids": sorted(unknown)}))
        return by_id

    def _each_call(self, plans: list, rows: dict, by_id: dict,
                   dropped: dict) -> tuple[list, list[tuple[int, dict]]]:
        """Each call in turn, as if alone: the results, and the reservations to insert (with
        the index of the result each one completes)."""
        results, pending = [], []
        for job, plan in zip(self.jobs, plans, strict=True):
            if job.kind == "audit":
                self.events.append(job.args)
                results.append(None)
            elif job.kind == "settle":
                results.append(self._settle(job.args, plan, rows, by_id, dropped))
            else:
                admission, reservation = self._admit(job.args, plan, rows)
                if reservation is not None:
                    pending.append((len(results), reservation))
                results.append(admission)
        return results, pending

    def _settle(self, a: SettleArgs, plan: SettlePlan, rows: dict, by_id: dict,
                dropped: dict) -> Settled:
        own = dropped.pop(a.reservation_id, None)
        if own is not None:
            amount, charged = own
            for key in charged:
                rows[key].reserved = max(rows[key].reserved - amount, Decimal(0))
        else:
            charged = plan.fallback
        alerts = charge_periods(self.conn, rows, by_id, charged, plan.cost, self.raised, self.seen)
        self.events.extend(alert_event(alert) for alert in alerts)
        return Settled(plan.cost, alerts)

    def _admit(self, a: ReserveArgs, plan: ReservePlan,
               rows: dict) -> tuple[Admission | None, dict | None]:
        """The call's admission, or (None, the reservation row to insert) when it reserves."""
        if not plan.budgets:
            return Admission(True, **a.base), None
        blocked = next((b for b, key in zip(plan.budgets, plan.keys, strict=True)
                        if b.action == "block"
                        and rows[key].spent + rows[key].reserved >= b.limit), None)
        if blocked is not None:
            spent = rows[(blocked.id, period_start(blocked.period, a.now, self.tz))].spent
            return Admission(False, blocked_by=blocked, spent=spent, **a.base), None
        for key in plan.keys:
            rows[key].reserved += plan.worst
        return None, {"amount": plan.worst, "periods": encode_periods(plan.keys),
                      "message_id": a.base["message_id"], "created_at": a.now}

    def _insert_reservations(self, pending: list[tuple[int, dict]], results: list) -> None:
        if not pending:
            return
        ids = self.conn.execute(reservation_insert(), [row for _, row in pending]).scalars()
        for (index, row), reservation_id in zip(pending, ids, strict=True):
            results[index] = Admission(True, reservation_id, row["amount"],
                                       **self.jobs[index].args.base)


# -- charging a cost, and the alerts it raises ---------------------------------------------------------
def charge_periods(conn: Connection, rows: dict[PeriodKey, PeriodRow], budgets: dict,
                   keys: Iterable[PeriodKey], cost: Decimal, raised: set[tuple] | frozenset,
                   seen: set[tuple]) -> list[RaisedAlert]:
    """Add ``cost`` to the locked period rows of ``keys``; the threshold alerts it raises
    (``raised``: committed before; ``seen``: raised in this transaction, added to)."""
    alerts = []
    for key in sorted(set(keys)):
        row, budget = rows[key], budgets.get(key[0])
        row.spent += cost
        if budget is None:
            continue
        for threshold in parse_thresholds(budget.thresholds):
            if row.spent * 100 < budget.limit * threshold:
                break
            once = (budget.id, row.period_start, threshold)
            if once in raised or once in seen:
                continue  # raised already (committed, or earlier in this batch)
            seen.add(once)
            alert = raise_alert_once(conn, budget, row, threshold)
            if alert is not None:
                alerts.append(alert)
    return alerts


def raise_alert_once(conn: Connection, budget, row: PeriodRow, threshold: int) -> RaisedAlert | None:
    """Insert the alert's row unless it exists: None when raised already, by this or another
    process."""
    stmt = dialect_insert(conn, BudgetAlert).values(
        budget_id=budget.id, period_start=row.period_start, threshold=threshold,
        spent=row.spent, limit=budget.limit, created_at=utcnow(),
    ).on_conflict_do_nothing(index_elements=["budget_id", "period_start", "threshold"])
    alert_id = conn.scalar(stmt.returning(BudgetAlert.id))
    if alert_id is None:
        return None
    return RaisedAlert(alert_id, budget.id, budget.scope, budget.scope_value, budget.period,
                       row.period_start, threshold, row.spent, budget.limit, budget.currency,
                       budget.action)

