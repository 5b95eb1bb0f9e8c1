"""Budget alerts a worker left undelivered, sent again by the hourly maintenance.

An alert is raised once (its ``budget_alerts`` row, unique per budget, period and threshold) and
sent after commit on a thread of the process that raised it. A process that dies in between
leaves the row unclaimed (``delivered`` NULL) or claimed and never marked (``sending``); one
whose every channel failed leaves it NULL too. ``redeliver`` takes those that are at least
``STALE_AFTER_S`` old (the sender has had its chance) and at most ``WINDOW_S`` (WeCom's longest
duplicate check: within it, a message that did arrive before the crash is dropped by WeCom, so
nobody reads an alert twice), claims each by a compare-and-set on what it found, and sends it.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import or_, select

from app.accounting.alerts import SENDING, RaisedAlert, claim
from app.db import utcnow
from app.models import Budget, BudgetAlert

STALE_AFTER_S = 300
WINDOW_S = 14400


def redeliver(db, sender, currency: str, now=None) -> int:
    """Claim and send the alerts left undelivered; how many."""
    now = now or utcnow()
    with db.session() as session:
        rows = session.execute(
            select(BudgetAlert, Budget).join(Budget, Budget.id == BudgetAlert.budget_id)
            .where(or_(BudgetAlert.delivered.is_(None), BudgetAlert.delivered == SENDING),
                   BudgetAlert.created_at <= now - timedelta(seconds=STALE_AFTER_S),
                   BudgetAlert.created_at >= now - timedelta(seconds=WINDOW_S))
            .order_by(BudgetAlert.id)).all()
    alerts = [RaisedAlert(alert.id, budget.id, budget.scope, budget.scope_value, budget.period,
                          alert.period_start, alert.threshold, alert.spent, alert.limit,
                          budget.currency or currency, budget.action)
              for alert, budget in rows if claim(db, alert.id, expected=alert.delivered)]
    if alerts:
        sender.deliver(alerts, claimed=True)
    return len(alerts)
