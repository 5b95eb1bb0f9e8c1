"""Budgets and usage around one model call of the message path.

``MessageProcessor._generate`` asks ``Meter.reserve`` before ``llm.generate`` (a budget at 100 %
with ``block`` gives the employee a notice instead of an answer: the notice card the first time
in the budget's period, a one-line reminder after it (``app.accounting.notices``); and a
``budget_block`` audit event), then ``settle`` with the token counts (the larger of the model server's report and the
upper-bound estimates, priced by the configured model), or ``release`` when the generation
failed. A charge that fails leaves the reservation, charged its worst case when it expires.
The user's department comes from WeCom ``user/get`` (``main_department``, else the first of
``department``), through ``worker.scope.directory``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from app.accounting import (
    Accounting,
    Admission,
    Usage,
    budget_notice,
    estimate_choice_tokens,
    estimate_completion_tokens,
    estimate_prompt_tokens,
    period_end,
    period_start,
)
from app.audit.chain import Event, EventType
from app.db import utcnow
from app.kf.messages import CHANNEL as KF_CHANNEL
from worker.kf.budget import KF_DEPARTMENT
from worker.scope.directory import Directory

log = logging.getLogger(__name__)


@dataclass
class Charge:
    admission: Admission
    notice: str | None = None

    @property
    def blocked(self) -> bool:
        return not self.admission.allowed


class Meter:
    def __init__(self, services, directory: Directory):
        self.services = services
        self.settings = services.settings
        self.directory = directory

    @property
    def accounting(self) -> Accounting:
        return self.services.accounting

    def department_of(self, user_hash: str, user_id: str) -> str:
        """The department a department budget charges (``worker.scope.directory``: the last
        one seen while WeCom's ``user/get`` fails, so a department's limit still holds)."""
        return self.directory.budget_department(user_hash, user_id)

    def reserve(self, row, user_id: str, messages: list[dict], max_new_tokens: int,
                model: str, choices: tuple[str, ...] = ()) -> Charge:
        """``choices``: the replies the model chooses among (KB_ANSWER_BY_QUOTING), whose
        tokens the engine processes too (``estimate_choice_tokens``)."""
        # a 微信客服 customer is in no department: the ledger's ``kf`` (worker.kf.budget)
        department = KF_DEPARTMENT if row.channel == KF_CHANNEL else self.department_of(row.user_hash, user_id)
        prompt_tokens = estimate_prompt_tokens(messages) + estimate_choice_tokens(choices)
        if not getattr(row, "budgeted", True):
            # No budget was enabled at the claim (``app.outbox.rows``): admitted as reserve
            # would admit it, without a group commit that reads the budgets to find none; its
            # settle charges none either (one enabled meanwhile applies from the next message).
            return Charge(Admission(True, user_hash=row.user_hash, department=department,
                                    model=model, message_id=row.id,
                                    prompt_tokens=prompt_tokens, budgeted=False))
        admission = self.accounting.reserve(
            row.user_hash, department, model, prompt_tokens, max_new_tokens,
            message_id=row.id, user_hashes=self.services.blind_index.candidates("wecom-user", user_id))
        if admission.allowed:
            return Charge(admission)
        budget = admission.blocked_by
        self.services.audit.record(
            self.services.db, EventType.BUDGET_BLOCK, actor=row.user_hash, outcome="blocked",
            request_id=row.request_id,
            payload={"message_id": row.id, "budget_id": budget.id, "scope": budget.scope,
                     "period": budget.period, "spent": str(admission.spent),
                     "limit": str(budget.limit)})
        now = utcnow()
        first = self.first_notice(budget, row, now)
        notice = budget_notice(budget, admission.spent, now, self.settings.timezone,
                               getattr(budget, "currency", None) or self.settings.currency, first)
        return Charge(admission, notice.text)

    def first_notice(self, budget, row, now) -> bool:
        """Is this the first message ``budget`` refuses this employee in its period? The mark
        holds the message id, so a retried task gets the card again, not the reminder; without
        Redis, the card (saying too much beats saying too little)."""
        start = period_start(budget.period, now, self.settings.timezone)
        expires = period_end(budget.period, start, self.settings.timezone) + timedelta(days=1)
        key = f"budget:notice:{budget.id}:{int(start.timestamp())}:{row.user_hash}"
        try:
            redis = self.services.redis
            if redis.set(key, str(row.id), nx=True, exat=int(expires.timestamp())):
                return True
            held = redis.get(key)
            return held is not None and held.decode() == str(row.id)
        except Exception:  # noqa: BLE001 - see the docstring
            log.warning("budget notice mark unavailable; the card goes out message_id=%s", row.id)
            return True

    def settle(self, charge: Charge, generation, latency_s: float) -> None:
        admission = charge.admission
        try:
            self.accounting.settle(admission, Usage(
                user_hash=admission.user_hash, department=admission.department,
                model=admission.model[:64], prompt_tokens=generation.prompt_tokens,
                completion_tokens=generation.completion_tokens,
                cached_tokens=generation.cached_tokens, latency_ms=int(latency_s * 1000),
                message_id=admission.message_id,
                estimated_completion_tokens=estimate_completion_tokens(generation.text,
                                                                       generation.reasoning)))
        except Exception:  # noqa: BLE001 - the answer still goes out; the reservation stays,
            # charged its worst case when it expires (BUDGET_RESERVATION_TTL_S)
            log.exception("usage not recorded message_id=%s", admission.message_id)

    def release(self, charge: Charge) -> None:
        try:
            self.accounting.release(charge.admission)
        except Exception:  # noqa: BLE001 - expires after BUDGET_RESERVATION_TTL_S anyway
            log.exception("reservation not released message_id=%s", charge.admission.message_id)

    def audit_reply(self, row, event_type: str, outcome: str, **payload) -> None:
        """Written by the accounting group commit (one transaction for the batch's events)."""
        try:
            self.accounting.record_audit(Event(event_type, actor=row.user_hash, outcome=outcome,
                                               request_id=row.request_id,
                                               payload={"message_id": row.id, **payload}))
        except Exception:  # noqa: BLE001 - the reply already happened; the log says it is missing
            log.exception("audit event %s not written message_id=%s", event_type, row.id)
