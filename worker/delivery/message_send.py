"""The app channel's delivery: the answer through message/send (WeCom's markdown where it has
markup, else text: ``present``), in chunks recorded as WeCom takes them, then the 👍/👎 card
after a model answer; a failure's notice the same way."""

from __future__ import annotations

import dataclasses
import logging

from app.llm import Generation, GenerationParams, LLMBackend
from app.outbox import rows
from app.outbox.statements import standalone
from app.wecom import markdown
from app.wecom.exceptions import (
    InvalidUserError,
    NoValidReceiverError,
    UntrustedIPError,
    WeComAPIError,
    WeComTransientError,
)
from worker import feedback
from worker.delivery import duplicate_check
from worker.delivery.reply import Reply
from worker.failures import LeaseLost, PermanentFailure, TransientFailure
from worker.media.handler import MEDIA_TYPES

log = logging.getLogger(__name__)


class MessageSend:
    streams = False

    def __init__(self, services, wecom):
        self.services, self.wecom = services, wecom

    def expired(self) -> bool:
        return False

    def present(self, reply: Reply) -> Reply:
        """What the employee sees: an answer with Markdown as WeCom's ``markdown`` message within
        what it renders; any other as ``text`` with the markup taken out (never a literal ``**``).
        WECOM_MARKDOWN=false: always text."""
        if reply.kind != "text" or not reply.sends:
            return reply
        if self.services.settings.wecom_markdown and markdown.has_markup(reply.text):
            return dataclasses.replace(reply, text=markdown.for_markdown(reply.text), kind="markdown")
        return dataclasses.replace(reply, text=markdown.to_plain(reply.text))

    def generate(self, llm: LLMBackend, messages: list[dict], params: GenerationParams) -> Generation:
        return llm.generate(messages, params)

    def deliver(self, row, owner: str, user_id: str, kind: str, chunks: list[str], lease) -> dict:
        """Send the chunks not sent yet, each recorded (``chunks_sent``) once WeCom took it; the
        last one's count is left for the caller's finish to write, in the same UPDATE that ends
        the message (``row.chunks_sent`` holds it): one transaction fewer, and no new window,
        since a crash right after a send loses its record either way."""
        # Any send may reach WeCom although its answer is lost (a timeout, a worker killed before
        # recording the chunk), so every send asks WeCom to drop an identical one within the
        # window. WeCom compares the whole request, so the first attempt must carry it too:
        # switching the check on only for retries let a timed-out first send arrive twice. A text
        # another message already sent this employee goes without it (worker.delivery.duplicate_check).
        for index in range(row.chunks_sent, len(chunks)):
            lease.check()
            interval = duplicate_check.interval_for(self.services, row.user_hash, row.id, chunks[index])
            try:
                self.wecom.send(user_id, kind, chunks[index], duplicate_check_interval=interval)
            except WeComTransientError as exc:
                raise TransientFailure(f"wecom: {exc}", rate_limited=exc.rate_limited,
                                       retry_after=exc.retry_after) from exc
            except UntrustedIPError as exc:
                log.error("WeCom refused this server's IP (60020): add it to the app's trusted IPs. %s", exc)
                raise PermanentFailure("wecom: untrusted ip (60020)", notify=False) from exc
            except (InvalidUserError, NoValidReceiverError) as exc:
                raise PermanentFailure("wecom: invalid receiver", notify=False) from exc
            except WeComAPIError as exc:
                raise PermanentFailure(f"wecom: errcode {exc.errcode}", notify=False) from exc
            if index + 1 < len(chunks):
                with standalone(self.services.db) as sql:
                    if not rows.save_progress(sql, row.id, owner, chunks_sent=index + 1):
                        raise LeaseLost()
            row.chunks_sent = index + 1
        return {"chunks_sent": row.chunks_sent}  # the last chunk's, recorded by the finish

    def nothing(self) -> None:
        pass

    def delivered(self, row, user_id: str) -> None:
        feedback.offer_card(self.services, self.wecom, row, user_id)

    def failed(self, row, notice: str | None) -> None:
        if notice is None or row.msg_type not in ("text", *MEDIA_TYPES):
            return
        try:
            user_id = self.services.cipher.decrypt(row.user_enc, rows.TABLE, "user_enc", row.id)
            self.wecom.send(user_id, "text", notice)
        except Exception:  # noqa: BLE001 - the failure is recorded either way
            log.warning("failure notice not delivered message_id=%s", row.id)
