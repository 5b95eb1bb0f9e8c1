"""The processor's kf steps: what happens before a customer's message is answered.

- the ``kf_msg_or_event`` row: its account's new messages become outbox rows (``app.kf.sync``);
- a customer a person serves (service_state 2 or 3) gets no answer from the bot: silence until
  the state returns (asked of WeCom for every message, so a session the servicer ended is the
  bot's again at once);
- past the 48-hour window: no answer (WeCom would refuse it), the row fails with the reason;
- "转人工" (KF_HANDOVER_WORDS), or the channel's token budget spent: the hand-over notice, then
  the hand-over (``worker.kf.delivery``);
- otherwise the ordinary path answers: the knowledge base with only the documents visible to
  everyone, the usage charged to the ``kf`` ledger department (``worker.kf.budget``).
"""

from __future__ import annotations

import logging

from app.kf import rules
from app.kf.messages import external_userid
from app.kf.sync import sync_account
from app.models import MessageStatus
from app.wecom import kf
from app.wecom.exceptions import WeComAPIError, WeComTransientError
from worker.delivery.reply import Reply
from worker.failures import PermanentFailure, TransientFailure
from worker.kf.budget import KfBudget
from worker.kf.delivery import KfSend

log = logging.getLogger(__name__)


def handover(reason: str | None = None) -> Reply:
    """The notice that hands the customer to a person (``worker.kf.delivery`` hands over after
    sending it); ``reason`` is kept in the row's failure_reason column."""
    return Reply(rules.HANDOVER_NOTICE, kind=rules.HANDOVER, usage={"failure_reason": reason} if reason else {})


class KfChannel:
    def __init__(self, services, wecom):
        self.services = services
        self.settings = services.settings
        self.api = kf.KfApi(wecom)
        self.budget = KfBudget(services)

    def delivery(self) -> KfSend:
        return KfSend(self.services, self.api)

    def sync(self, payload: dict) -> None:
        """The event's account read up to its newest message (``app.kf.sync``)."""
        if not self.settings.kf_enabled:
            log.info("kf event ignored: KF_ENABLED is false")
            return
        account = str(payload.get("open_kfid") or "")
        if not account:
            raise PermanentFailure("kf: event without an account", notify=False)
        with _wecom_errors("sync"):
            sync_account(self.services, self.api, account, str(payload.get("token") or ""))

    def before_answer(self, row, customer: str, payload: dict) -> Reply | None:
        """A reply that stands instead of the answer, or None: answer as usual."""
        if not rules.within_window(row.wecom_create_time):
            return Reply(sends=False, status=MessageStatus.FAILED, reason="kf: outside the 48-hour window")
        with _wecom_errors("service_state"):
            state, _ = self.api.service_state(str(payload.get("open_kfid") or ""), external_userid(customer))
        if state in (kf.QUEUED, kf.HUMAN):
            log.info("kf customer is with a person; the bot stays silent message_id=%s", row.id)
            return Reply(sends=False, status=MessageStatus.IGNORED, reason="kf: a person serves the customer")
        if rules.asks_for_human(payload.get("content") or "", self.settings.kf_handover_terms):
            return handover()
        if self.budget.spent():
            return handover("kf: token budget spent")
        return None


class _wecom_errors:
    """WeCom's errors as the processor's: retried later, or given up with the errcode."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, WeComTransientError):
            raise TransientFailure(f"kf {self.what}: {exc}", rate_limited=exc.rate_limited,
                                   retry_after=exc.retry_after) from exc
        if isinstance(exc, WeComAPIError):
            raise PermanentFailure(f"kf {self.what}: errcode {exc.errcode}", notify=False) from exc
        return False
