"""The kf channel's token budget: KF_BUDGET_TOKENS tokens a KF_BUDGET_PERIOD for all customers.

Customers are not employees: no department or user budget is theirs. Their calls are recorded
in the usage ledger under the department ``kf`` (no WeCom department id is a word), so the
dashboard shows the channel's spend apart, a money budget can be set on it like any
department's (scope ``department``, value ``kf``), and this token budget reads what the channel
used this period from the daily rollup. Over it, the customer is handed to a person.
"""

from __future__ import annotations

import logging

from sqlalchemy import func, select

from app.accounting import period_start
from app.db import utcnow
from app.models import UsageDaily

log = logging.getLogger(__name__)
KF_DEPARTMENT = "kf"


class KfBudget:
    def __init__(self, services):
        self.services = services
        self.settings = services.settings

    def used(self) -> int:
        """Tokens the channel used since its period began (company-local days)."""
        start = period_start(self.settings.kf_budget_period, utcnow(), self.settings.timezone)
        first_day = start.astimezone(self.settings.timezone).date()
        with self.services.db.reader() as session:
            total = session.scalar(
                select(func.coalesce(func.sum(UsageDaily.prompt_tokens + UsageDaily.completion_tokens), 0))
                .where(UsageDaily.department == KF_DEPARTMENT, UsageDaily.day >= first_day))
        return int(total or 0)

    def spent(self) -> bool:
        """Whether the channel's budget for this period is used up (never, with none set)."""
        limit = self.settings.kf_budget_tokens
        if not limit:
            return False
        used = self.used()
        if used >= limit:
            log.info("kf token budget spent used=%d limit=%d", used, limit)
            return True
        return False
