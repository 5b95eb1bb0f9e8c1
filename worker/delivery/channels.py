"""Delivering a composed reply (``worker.delivery.reply.Reply``): one interface, two channels.

- ``MessageSend`` (``worker.delivery.message_send``): the app's answer through message/send,
  split at WeCom's byte limits, each chunk recorded once WeCom took it so that a retry resumes
  at the first unsent one, and the 👍/👎 card after a model answer (``FEEDBACK_CARDS``);
- ``StreamDelivery`` (``worker.delivery.stream``): the AI bot's answer written into its stream
  while the model generates (throttled, stopped at the stream's deadline) and finished with the
  whole reply; the callback's refreshes and the long connection read the stream.

The processor (``worker.processor``) asks ``Deliveries.for_row`` for one per row and never asks
which.
"""

from __future__ import annotations

from typing import Protocol

from app.llm import Generation, GenerationParams, LLMBackend
from worker.delivery.message_send import MessageSend
from worker.delivery.stream import StreamDelivery
from worker.delivery.stream_writer import StreamWriter

AIBOT = "aibot"  # the 智能机器人 channel: answered by streaming, not message/send
KF = "kf"  # 微信客服: answered through kf/send_msg (worker.kf)


class Delivery(Protocol):
    #: The answer is shown while it is generated (sources cited in markdown, no "🎤 heard" first).
    streams: bool

    def expired(self) -> bool:
        """Has the employee already been told that the answer will not come (before composing)?"""

    def present(self, reply):
        """The composed ``Reply`` as this channel shows it (the app: markdown or plain text)."""

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


class Deliveries:
    """Picks the channel a row is answered through; built once per processor."""

    def __init__(self, services, wecom, kf_delivery=None):
        self.services, self.wecom = services, wecom
        self.kf_delivery = kf_delivery  # () -> the 微信客服 channel's (worker.kf.delivery)

    def for_row(self, row) -> Delivery:
        """The AI bot stream this row answers into, kf/send_msg for a 微信客服 customer, or
        message/send."""
        if row.channel == KF and self.kf_delivery is not None:
            return self.kf_delivery()
        if row.channel != AIBOT or not row.stream_id:
            return MessageSend(self.services, self.wecom)
        s = self.services.settings
        return StreamDelivery(StreamWriter(self.services.streams, row.stream_id, row.id,
                                           row.created_at.timestamp(), s.aibot_stream_deadline_s,
                                           s.aibot_refresh_throttle_s))
