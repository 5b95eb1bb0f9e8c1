"""The ledger: budget enforcement and usage recording over one ``Database``.

- **Usage**: one ``usage_records`` row per model call, and in the same transaction an atomic
  upsert (``INSERT ... ON CONFLICT DO UPDATE``) of the ``usage_daily`` rollup per company-local
  day x department x user x model, which the dashboards read.
- **Budgets**: before a generation ``reserve`` holds its worst case on every applicable
  budget's period row, under a row lock (an upsert that takes it: PostgreSQL's row lock;
  SQLite's write lock); a budget whose spent + reserved has reached its limit refuses
  (``block``) or lets it pass (``warn``). ``settle`` turns the reservation into the real cost,
  ``release`` drops it (the generation failed).
- **Charges fail closed**: a call is charged the larger of the token counts the model reported
  and the estimates (``app.accounting.prices``); it is priced by the configured model the
  reservation named, never by the name the server answered with. A reservation nobody settled
  (a worker killed mid-call, a charge that failed) is charged its worst case when it expires
  (``expire_reservations``), not released.

``reserve``, ``settle`` and ``record_audit`` go through the process's ledger writer
(``app.accounting.group_commit``), which hands each batch to ``write_batch``
(``app.accounting.batch`` holds what a batch does).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

from sqlalchemy import func, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from app import pg_liveness
from app.accounting.alerts import RaisedAlert, alert_event
from app.accounting.batch import Batch, ReserveArgs, SettleArgs, charge_periods
from app.accounting.budgets import Admission, Settled, Usage, applicable_budgets
from app.accounting.group_commit import GroupCommit, Job
from app.accounting.periods import period_start
from app.accounting.statements import (
    budgets_by_id,
    decode_periods,
    drop_reservations_statement,
    lock_periods,
    write_periods,
)
from app.audit.chain import Event
from app.db import utcnow
from app.models import BudgetPeriod, BudgetReservation, UsageDaily

log = logging.getLogger(__name__)


class Accounting:
    """Budget enforcement and usage recording over one ``Database``.

    ``reserve`` and ``settle`` go through the process's group commit (``GroupCommit``): the
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
        self._writer = GroupCommit(self.write_batch, self._give_back)
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
        return self._run("reserve", ReserveArgs(
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
                write_periods(conn, dropped[1])

    def _drop_reservation(self, conn: Connection, reservation_id: int):
        """Delete a reservation and take it off its periods' ``reserved``: (its amount, its
        locked period rows), or None when it was gone already (released, settled, expired)."""
        held = conn.execute(drop_reservations_statement(), {"ids": [reservation_id]}).first()
        if held is None:
            return None
        periods = lock_periods(conn, decode_periods(held.periods))
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
        settled = self._run("settle", SettleArgs(
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
        if queue is not None and queue.held_by_this_thread():
            # SQLite: the writer would wait for this thread's transaction, this thread for it.
            raise RuntimeError(f"Accounting.{kind} called inside a write transaction of this "
                               "thread on SQLite: it would wait for itself")
        return self._writer.run(kind, args)

    def write_batch(self, jobs: list[Job]) -> None:
        """Apply ``jobs`` in one transaction (``Batch``) and answer each; when that fails, each
        alone (unless the connection was lost: then whether it committed is unknown, and all of
        them fail). The writer thread calls it; tests call it to write a batch they made."""
        seen: set[tuple] = set()
        try:
            if (self._connection is not None and self._connection_pid == os.getpid()
                    and not pg_liveness.still_open(self._connection)):
                self._give_back()  # closed while held (a server restart): as the pool would
            if self._connection is None or self._connection_pid != os.getpid():
                # (a forked child never touches its parent's connection: it takes its own)
                self._connection, self._connection_pid = self.db.engine.connect(), os.getpid()
            with self._connection.begin():
                results = Batch(self._connection, jobs, tz=self.tz, currency=self.currency,
                                audit=self.audit, raised=self._alerts_raised, seen=seen).apply()
        except Exception as exc:  # noqa: BLE001 - handed to the callers
            lost = isinstance(exc, DBAPIError) and exc.connection_invalidated
            if self._connection is not None and self._connection.invalidated:
                self._give_back()
            if len(jobs) == 1 or lost:
                for job in jobs:
                    job.finish(error=exc)
            else:
                for job in jobs:
                    self.write_batch([job])
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

    @property
    def writer_connection(self) -> Connection | None:
        """The connection the writer holds between batches (None once it gave it back)."""
        return self._connection

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
                    budgets_by_id(), {"ids": sorted({k[0] for k in periods})})}
                alerts = charge_periods(conn, periods, budgets, periods, amount,
                                        self._alerts_raised, set())
                write_periods(conn, periods)
                if alerts and self.audit is not None:
                    self.audit.append_many(conn, [alert_event(alert) for alert in alerts])
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
