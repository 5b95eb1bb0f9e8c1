"""Delivering a composed reply (``worker.reply.Reply``): one interface, two channels.

- ``MessageSend``: the app's answer through message/send, split at WeCom's byte limits, each
  chunk recorded once WeCom took it so that a retry resumes at the first unsent one, and the
  👍/👎 card after a model answer (``FEEDBACK_CARDS``);
- ``StreamDelivery``: the AI bot's answer written into its stream while the model generates
  (``worker.stream_reply.StreamWriter``: throttled, stopped at the stream's deadline) and finished
  with the whole reply; the callback's refreshes and the long connection read the stream.

The processor (``worker.processor``) picks one per row (``for_row``) and never asks which.
"""

from __future__ import annotations

import logging
from typing import Protocol

from app.accounting import estimate_completion_tokens, estimate_prompt_tokens
from app.llm import Generation, GenerationParams, LLMBackend
from app.outbox import rows
from app.outbox.statements import standalone
from app.wecom.exceptions import (
    InvalidUserError,
    NoValidReceiverError,
    UntrustedIPError,
    WeComAPIError,
    WeComTransientError,
)
from worker import duplicate_check, feedback, media
from worker.failures import LeaseLost, PermanentFailure, TransientFailure
from worker.stream_reply import StreamWriter

log = logging.getLogger(__name__)
AIBOT = "aibot"  # the 智能机器人 channel: answered by streaming, not message/send
DEADLINE = "deadline"  # a streamed generation stopped at the AI bot stream's time limit


class Delivery(Protocol):
    #: The answer is shown while it is generated (sources cited in markdown, no "🎤 heard" first).
    streams: bool

    def expired(self) -> bool:
        """Has the employee already been told that the answer will not come (before composing)?"""

    def generate(self, llm: LLMBackend, messages: list[dict], params: GenerationParams) -> Generation:
        """The model's answer, shown on the way where the channel can."""

    def deliver(self, row, owner: str, user_id: str, kind: str, chunks: list[str], lease) -> dict:
        """Send what is not sent yet; the values the row's finish writes."""

    def nothing(self) -> None:
        """There is no answer: end what the channel holds open."""

    def delivered(self, row, user_id: str) -> None:
        """After the row is answered (the feedback card)."""

    def failed(self, row, notice: str | None) -> None:
        """The message failed: tell the employee ``notice`` (None: say nothing more)."""


def for_row(processor, row) -> Delivery:
    """The AI bot stream this row answers into, or message/send."""
    if row.channel != AIBOT or not row.stream_id:
        return MessageSend(processor)
    s = processor.settings
    return StreamDelivery(StreamWriter(processor.services.streams, row.stream_id, row.id,
                                       row.created_at.timestamp(), s.aibot_stream_deadline_s,
                                       s.aibot_refresh_throttle_s))


class MessageSend:
    streams = False

    def __init__(self, processor):
        self.processor = processor

    def expired(self) -> bool:
        return False

    def generate(self, llm: LLMBackend, messages: list[dict], params: GenerationParams) -> Generation:
        return llm.generate(messages, params)

    def deliver(self, row, owner: str, user_id: str, kind: str, chunks: list[str], lease) -> dict:
        """Send the chunks not sent yet, each recorded (``chunks_sent``) once WeCom took it; the
        last one's count is left for the caller's finish to write, in the same UPDATE that ends
        the message (``row.chunks_sent`` holds it): one transaction fewer, and no new window,
        since a crash right after a send loses its record either way."""
        processor = self.processor
        # Any send may reach WeCom although its answer is lost (a timeout, a worker killed before
        # recording the chunk), so every send asks WeCom to drop an identical one within the
        # window. WeCom compares the whole request, so the first attempt must carry it too:
        # switching the check on only for retries let a timed-out first send arrive twice. A text
        # another message already sent this employee goes without it (worker.duplicate_check).
        for index in range(row.chunks_sent, len(chunks)):
            lease.check()
            interval = duplicate_check.interval_for(processor.services, row.user_hash, row.id, chunks[index])
            try:
                processor.wecom.send(user_id, kind, chunks[index], duplicate_check_interval=interval)
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
                with standalone(processor.services.db) as sql:
                    if not rows.save_progress(sql, row.id, owner, chunks_sent=index + 1):
                        raise LeaseLost()
            row.chunks_sent = index + 1
        return {"chunks_sent": row.chunks_sent}  # the last chunk's, recorded by the finish

    def nothing(self) -> None:
        pass

    def delivered(self, row, user_id: str) -> None:
        feedback.offer_card(self.processor, row, user_id)

    def failed(self, row, notice: str | None) -> None:
        if notice is None or row.msg_type not in ("text", *media.MEDIA_TYPES):
            return
        processor = self.processor
        try:
            user_id = processor.services.cipher.decrypt(row.user_enc, rows.TABLE, "user_enc", row.id)
            processor.wecom.send(user_id, "text", notice)
        except Exception:  # noqa: BLE001 - the failure is recorded either way
            log.warning("failure notice not delivered message_id=%s", row.id)


class StreamDelivery:
    streams = True

    def __init__(self, writer: StreamWriter):
        self.writer = writer

    def expired(self) -> bool:
        # The callback gave up on us at WeCom's deadline and told the employee so.
        return self.writer.finished_already()

    def generate(self, llm: LLMBackend, messages: list[dict], params: GenerationParams) -> Generation:
        return stream_generation(llm, messages, params, self.writer)

    def deliver(self, row, owner: str, user_id: str, kind: str, chunks: list[str], lease) -> dict:
        if not self.writer.finish(chunks[0]):
            return {"failure_reason": "aibot: stream closed by the callback at the deadline"}
        return {}

    def nothing(self) -> None:
        self.writer.finish("")

    def delivered(self, row, user_id: str) -> None:
        pass  # the AI bot's 👍/👎 rides on the stream's feedback id (app.aibot_callback)

    def failed(self, row, notice: str | None) -> None:
        self.writer.finish(notice or "")  # WeCom stops polling either way


def stream_generation(llm: LLMBackend, messages: list[dict], params: GenerationParams,
                      on_text) -> Generation:
    """Run the model through its streaming interface, handing ``on_text`` the answer so far.

    Only the answer is handed on, never the think part; ``on_text`` is still asked while the
    model thinks, so its deadline holds then too. When ``on_text`` says stop, the generation is
    abandoned (closing the stream aborts it in the engine or the HTTP request to the model
    server) and what was written is the answer; its token counts are then estimated from the
    text, thinking included, an upper bound like the budget's.
    """
    parts: list[str] = []
    thoughts: list[str] = []
    deltas = llm.stream(messages, params)
    try:
        for delta in deltas:
            if delta.final is not None:
                return delta.final
            if delta.reasoning:
                thoughts.append(delta.reasoning)
            if delta.text:
                parts.append(delta.text)
            if (delta.text or delta.reasoning) and not on_text("".join(parts)):
                break
    finally:
        deltas.close()
    text, reasoning = "".join(parts), "".join(thoughts)
    return Generation(text=text, model=llm.model_name, prompt_tokens=estimate_prompt_tokens(messages),
                      completion_tokens=estimate_completion_tokens(text, reasoning),
                      finish_reason=DEADLINE,
                      reasoning=reasoning)
