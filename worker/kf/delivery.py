"""The kf channel's delivery: the answer through kf/send_msg, within WeCom's rules.

Each message carries a msgid of ours, ``<row>-<index>``: WeCom refuses a second message with a
msgid it has (95017), so a send whose answer was lost (a timeout, a worker killed before the
chunk was recorded) is retried safely and that refusal counts as sent. A reply of kind
``kf_handover`` ends by handing the customer to a person (kf/service_state/trans): to
KF_SERVICER_USERID (state 3) when one is set, else to the account's queue (state 2). The notice
goes first: once a person serves the customer, the bot may no longer write.
"""

from __future__ import annotations

import dataclasses
import json
import logging

from app.kf import rules
from app.kf.messages import external_userid
from app.knowledge import prompt
from app.llm import Generation, GenerationParams, LLMBackend
from app.outbox import rows
from app.outbox.statements import standalone
from app.wecom import kf, markdown
from app.wecom.exceptions import WeComAPIError, WeComTransientError
from worker.delivery.reply import Reply
from worker.failures import LeaseLost, PermanentFailure, TransientFailure

log = logging.getLogger(__name__)


def account_of(services, row) -> str:
    """The kf account a customer's row came through (in its sealed payload)."""
    payload = json.loads(services.cipher.decrypt(row.payload_enc, rows.TABLE, "payload_enc", row.id))
    return str(payload.get("open_kfid") or "")


def hand_over(services, api: kf.KfApi, open_kfid: str, customer: str) -> int:
    """Hand the customer to a person; the state asked for. A customer already with a person
    (or in the queue) stays there."""
    servicer = services.settings.kf_servicer_userid
    target = kf.HUMAN if servicer else kf.QUEUED
    state, _ = api.service_state(open_kfid, customer)
    if state in (kf.QUEUED, kf.HUMAN):
        return state
    api.transfer(open_kfid, customer, target, servicer)
    log.info("kf customer handed over service_state=%d", target)
    return target


class KfSend:
    streams = False

    def __init__(self, services, api: kf.KfApi):
        self.services, self.api = services, api

    def expired(self) -> bool:
        return False

    def present(self, reply: Reply) -> Reply:
        """Plain text (WeChat shows no markdown); a decline of the knowledge base becomes a
        hand-over: the customer gets a person rather than "ask another team"."""
        if not reply.sends:
            return reply
        text = markdown.to_plain(reply.text) if reply.kind == "text" else reply.text
        if reply.kind == "text" and _declined(reply):
            return dataclasses.replace(reply, text=f"{text}\n{rules.DECLINE_HANDOVER}", kind=rules.HANDOVER)
        return dataclasses.replace(reply, text=text)

    def generate(self, llm: LLMBackend, messages: list[dict], params: GenerationParams) -> Generation:
        return llm.generate(messages, params)

    def deliver(self, row, owner: str, user_id: str, kind: str, chunks: list[str], lease) -> dict:
        if not rules.within_window(row.wecom_create_time):
            raise PermanentFailure("kf: outside the 48-hour window", notify=False)
        open_kfid, customer = account_of(self.services, row), external_userid(user_id)
        for index in range(row.chunks_sent, len(chunks)):
            lease.check()
            self._send(open_kfid, customer, chunks[index], f"{row.id}-{index}")
            if index + 1 < len(chunks):
                with standalone(self.services.db) as sql:
                    if not rows.save_progress(sql, row.id, owner, chunks_sent=index + 1):
                        raise LeaseLost()
            row.chunks_sent = index + 1
        if kind == rules.HANDOVER:
            try:
                hand_over(self.services, self.api, open_kfid, customer)
            except WeComTransientError as exc:
                raise TransientFailure(f"kf: {exc}") from exc
            except WeComAPIError as exc:
                raise PermanentFailure(f"kf: hand-over refused, errcode {exc.errcode}", notify=False) from exc
        return {"chunks_sent": row.chunks_sent}

    def _send(self, open_kfid: str, customer: str, text: str, msgid: str) -> None:
        try:
            self.api.send_text(open_kfid, customer, text, msgid)
        except WeComTransientError as exc:
            raise TransientFailure(f"kf: {exc}", rate_limited=exc.rate_limited,
                                   retry_after=exc.retry_after) from exc
        except WeComAPIError as exc:
            if exc.errcode == kf.DUPLICATE_MSGID:  # sent before; its answer was lost
                return
            if exc.errcode in kf.SEND_REFUSED:
                raise PermanentFailure(f"kf: send refused by its rules, errcode {exc.errcode}",
                                       notify=False) from exc
            raise PermanentFailure(f"kf: errcode {exc.errcode}", notify=False) from exc

    def nothing(self) -> None:
        pass

    def delivered(self, row, user_id: str) -> None:
        pass  # no 👍/👎 card on WeChat

    def failed(self, row, notice: str | None) -> None:
        if notice is None or row.msg_type != "text" or not rules.within_window(row.wecom_create_time):
            return
        try:
            user_id = self.services.cipher.decrypt(row.user_enc, rows.TABLE, "user_enc", row.id)
            self.api.send_text(account_of(self.services, row), external_userid(user_id), notice,
                               f"{row.id}-failed")
        except Exception:  # noqa: BLE001 - the failure is recorded either way
            log.warning("kf failure notice not delivered message_id=%s", row.id)


def _declined(reply: Reply) -> bool:
    return reply.usage.get("model") == "kb-not-found" or prompt.is_decline(reply.text)
