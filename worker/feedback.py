"""The worker's side of feedback (``app.feedback.ratings``): the 👍/👎 card after a model answer on the
app channel, the card's click (``template_card_event``), the AI bot's own 👍/👎
(``feedback_event``), and the ``/feedback <text>`` command.

Nothing here may fail a message: the answer has been sent when the card is offered, and a click
is an event with no reply. A failed card send or update is logged and counted, never retried
(a retried card would carry the same task id, which WeCom refuses anyway).
"""

from __future__ import annotations

import logging

from app.feedback import ratings as feedback
from app.wecom.exceptions import WeComAPIError, WeComTransientError
from worker import commands

log = logging.getLogger(__name__)
CARD_EVENT = feedback.CARD_EVENT
AIBOT_EVENT = feedback.AIBOT_EVENT
COMMENT_THANKS = "谢谢你的反馈！我们会认真阅读。\nThanks for your feedback!"
COMMENT_USAGE = "用法：/feedback 你的意见\nUsage: /feedback <your comment>"


def offer_card(services, wecom, row, user_id: str) -> None:
    """After a model answer on the app channel: the 👍/👎 card keyed by the message."""
    settings = services.settings
    if not settings.feedback_cards or not row.model or (row.channel or "app") != "app":
        return
    card = feedback.build_card(feedback.task_id(services.blind_index, row.id))
    try:
        wecom.send_template_card(user_id, card, duplicate_check_interval=settings.wecom_duplicate_check_s)
    except (WeComAPIError, WeComTransientError, ValueError) as exc:
        log.warning("feedback card not sent message_id=%s: %s", row.id, exc)
    except Exception:  # noqa: BLE001 - the answer is already delivered
        log.exception("feedback card not sent message_id=%s", row.id)


def on_card_event(services, wecom, row, user_id: str, payload: dict) -> None:
    """A click on a feedback card: store the rating once, then mark the card as rated."""
    click = feedback.parse_click(services.blind_index, payload)
    if click is None:
        log.info("template_card_event not from a feedback card message_id=%s", row.id)
        return
    # the asker under every key of the blind-index ring (the answer may predate a key rotation)
    askers = [row.user_hash, *services.blind_index.candidates("wecom-user", user_id)]
    result = feedback.record_rating(services, click.message_id, askers, click.rating,
                                    services.settings.timezone, channel=row.channel or "app",
                                    request_id=row.request_id, reasons=click.reasons)
    log.info("feedback rating message_id=%s rated=%s result=%s", row.id, click.message_id, result)
    if result == feedback.Recorded.UNKNOWN or not click.response_code:
        return
    try:
        wecom.update_template_card([user_id], click.response_code,
                                   replace_name=feedback.RATED_TEXT[click.rating])
    except Exception as exc:  # noqa: BLE001 - the rating is stored; the card stays clickable
        log.warning("feedback card not updated message_id=%s: %s", row.id, exc)


def on_aibot_feedback(services, row, user_id: str, payload: dict) -> None:
    """An AI bot ``feedback_event``: the rater's 👍/👎 (or its withdrawal) of the answer its
    ``feedback.id`` names, recorded for the asker only; anything else is a log line. No reply:
    WeCom shows the rating itself."""
    rated = feedback.parse_aibot_feedback(services.blind_index, payload)
    if isinstance(rated, str):
        log.warning("aibot feedback_event not recorded message_id=%s: %s", row.id, rated)
        return
    askers = [row.user_hash, *services.blind_index.candidates("wecom-user", user_id)]
    result = feedback.record_aibot_feedback(services, rated, askers, services.settings.timezone,
                                            request_id=row.request_id)
    if result == feedback.Recorded.UNKNOWN:
        log.warning("aibot feedback_event not recorded message_id=%s rated=%s: no such answer, or "
                    "not this employee's", row.id, rated.message_id)
    elif result == feedback.Recorded.NOT_AN_ANSWER:
        log.warning("aibot feedback_event not recorded message_id=%s rated=%s: not a model answer "
                    "of the AI bot", row.id, rated.message_id)
    else:
        log.info("aibot feedback rating message_id=%s rated=%s type=%s result=%s", row.id,
                 rated.message_id, rated.kind, result)


@commands.register("feedback", "对回答提意见 / comment on the answers")
def _feedback(context: commands.CommandContext) -> str:
    text = context.argument.strip()
    if not text:
        return COMMENT_USAGE
    department = context.meter.department_of(context.user_hash, context.user_id)
    feedback.store_comment(context.services, context.user_hash, text, context.services.settings.timezone,
                           department=department)
    return COMMENT_THANKS
