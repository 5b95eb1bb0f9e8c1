"""What composing a message's answer gives the delivery: a ``Reply`` value.

The processor composes (``worker.processor``: the rate limit, commands, the welcome, media, the
model) and stores the reply before anything is sent; a delivery (``worker.delivery``) sends it.
A reply that sends nothing still says how the row ends: ``ignored`` (nothing to answer) or
``rate_limited`` (the notice was already sent in this window).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.models import MessageStatus

FAILURE_NOTICE = ("抱歉，我暂时无法回答这个问题，请稍后再试。\n"
                  "Sorry, I could not answer this right now. Please try again later.")
RATE_LIMIT_NOTICE = ("您发送得太快了，请稍后再试。\n"
                     "You're sending messages too fast, please wait a moment.")


@dataclass(frozen=True)
class Reply:
    """``text`` in ``kind`` (text or markdown) with the usage columns stored beside it (a model
    answer's model and tokens, a media notice's failure reason); ``sends`` false when there is
    nothing to deliver, the row then finished with ``status`` and ``reason``. ``sources``: the
    passages (``app.knowledge.retrieval.Passage``) the answer cites, recorded with it for the
    feedback report (``app.feedback.sources``)."""

    text: str = ""
    kind: str = "text"
    usage: dict = field(default_factory=dict)
    sends: bool = True
    status: str = MessageStatus.ANSWERED
    reason: str | None = None
    sources: tuple = ()

    @classmethod
    def nothing(cls) -> Reply:
        """No answer (an event, an empty message): the row is ``ignored``."""
        return cls(sends=False, status=MessageStatus.IGNORED)

    @classmethod
    def silenced(cls) -> Reply:
        """Over the user's rate limit after the notice: no answer at all."""
        return cls(sends=False, status=MessageStatus.RATE_LIMITED,
                   reason="rate limited: notice already sent in this window")

    @classmethod
    def rate_limit_notice(cls) -> Reply:
        return cls(RATE_LIMIT_NOTICE, status=MessageStatus.RATE_LIMITED)

    @classmethod
    def stored(cls, text: str, kind: str | None) -> Reply:
        """The reply a previous attempt stored (and may have sent in part)."""
        status = MessageStatus.RATE_LIMITED if text == RATE_LIMIT_NOTICE else MessageStatus.ANSWERED
        return cls(text, kind or "text", status=status)
