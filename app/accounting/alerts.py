"""Budget alerts: what a raised alert says, its audit event, and its delivery.

A threshold (percent of the limit) reached is one ``budget_alerts`` row, unique per (budget,
period start, threshold), so each alert is raised once even under concurrency (the ledger
writer inserts it). It is audited, then sent off the reply path by ``AlertSender``: a WeCom
message to ``ALERT_WECOM_USERS``, the optional webhook, and the routes it is given (a department
budget's alert to the department's heads: ``app.accounting.heads``), in a background thread
with a timeout. The row is claimed first (``delivered`` from NULL to ``sending``, a
compare-and-set), so the sender and the hourly redelivery of alerts a dead worker left
(``app.accounting.redelivery``) never both send one; the channels that took it are then
recorded on the row (NULL when none did: the redelivery tries again).
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import update

from app.audit.chain import Event, EventType
from app.models import BudgetAlert

log = logging.getLogger(__name__)
SCOPE_NAMES = {"global": "公司 company", "department": "部门 department", "user": "个人 user",
               "api_key": "API key"}
PERIOD_NAMES = {"day": "今日 today", "week": "本周 this week", "month": "本月 this month"}


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


def alert_event(alert: RaisedAlert) -> Event:
    """The audit event of a raised alert (written in the transaction that raised it)."""
    return Event(EventType.BUDGET_ALERT, actor="system", outcome=f"{alert.threshold}%",
                 payload=alert.as_json())


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


SENDING = "sending"


def claim(db, alert_id: int, expected: str | None = None) -> bool:
    """Take the alert's delivery: ``delivered`` from ``expected`` (NULL: never tried, or nothing
    took it) to ``sending``; False when another process has it or it was delivered."""
    current = BudgetAlert.delivered.is_(None) if expected is None else BudgetAlert.delivered == expected
    with db.transaction() as session:
        result = session.execute(update(BudgetAlert).where(BudgetAlert.id == alert_id, current)
                                 .values(delivered=SENDING).execution_options(synchronize_session=False))
        return result.rowcount == 1


def mark_delivered(db, alert_id: int, channels: list[str]) -> None:
    with db.transaction() as session:
        session.execute(update(BudgetAlert).where(BudgetAlert.id == alert_id)
                        .values(delivered=",".join(channels)[:64] or None))


DUPLICATE_CHECK_S = 14400  # WeCom drops the same message sent again within 4 h (a redelivery)


class AlertSender:
    """Sends alerts off the reply path: WeCom text to the admins, and the webhook (POST JSON)."""

    def __init__(self, wecom, recipients: list[str], webhook_url: str | None, timeout_s: float,
                 db=None, http_post=None, routes=()):
        """``routes``: more deliveries, each ``route(alert) -> [channel, ...]`` that took it."""
        self.wecom = wecom
        self.routes = list(routes)
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

    def deliver(self, alerts: list[RaisedAlert], claimed: bool = False) -> None:
        """``claimed``: the caller holds the rows' claim already (the redelivery)."""
        for alert in alerts:
            if self.db is not None and not claimed and not self._claim(alert):
                continue
            channels = []
            if self.recipients and self.wecom is not None:
                try:
                    self.wecom.send("|".join(self.recipients), "text", alert_text(alert),
                                    duplicate_check_interval=DUPLICATE_CHECK_S)
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
            for route in self.routes:
                try:
                    channels.extend(route(alert))
                except Exception:  # noqa: BLE001 - same
                    log.warning("budget alert %s: a delivery route failed", alert.alert_id)
            if self.db is not None:
                try:
                    mark_delivered(self.db, alert.alert_id, channels)
                except Exception:  # noqa: BLE001
                    log.warning("could not record delivery of budget alert %s", alert.alert_id)

    def _claim(self, alert: RaisedAlert) -> bool:
        try:
            return claim(self.db, alert.alert_id)
        except Exception:  # noqa: BLE001 - unsure: send (at least once), as before claims existed
            log.warning("budget alert %s: delivery not claimed; sent anyway", alert.alert_id)
            return True
