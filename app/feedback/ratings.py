"""Feedback on answers: 👍/👎 on each model answer, ``/feedback <text>`` comments, and the reports.

On the app channel the worker follows a model answer with a template card of WeCom's
``button_interaction`` type (模板卡片消息, ``message/send`` with ``msgtype: template_card``). Its
``task_id`` names the answered message (``fb-<message id>-<keyed check>``): the check is a blind
index of the id, so a task id cannot be made up for another message. Its drop-down
(``button_selection``) offers the 👎's reasons. A click comes back as the
``template_card_event`` callback (``EventKey`` the button's key, ``TaskId``, ``ResponseCode``,
``SelectedItems`` the drop-down's choice, stored as the 👎's reason codes),
signed and encrypted like every callback; it goes through the outbox like any event, and the
worker records the rating and turns the card's buttons into "rated" with
``message/update_template_card`` (the callback's ``response_code``, usable once, for 72 h).

A rating is stored once per message (``answer_ratings.message_id`` is unique): WeCom's retries
of the event and a second click store nothing new and are not audited twice. Ratings carry the
answer's model and the employee's department (copied from the answer's usage row), never text.
Comments are sealed (AES-GCM, ``comment_enc``) like message text. Both are audited
(``feedback`` events, without the text).

On the AI bot (智能机器人) channel WeCom has its own 👍/👎: a reply whose *first* stream reply
carries ``stream.feedback.id`` shows the thumbs, and a rating comes back as the
``feedback_event`` event (callback or long connection) with that id, ``type`` 1 accurate, 2
inaccurate (with ``inaccurate_reason_list`` codes and free text) or 3 withdrawn. The id is the
same keyed ``fb-<message id>-<check>`` (``feedback_id``), put on the first reply by whoever
sends it (the callback's immediate answer, the connection holder's first frame) for every
question that is not a command. The event goes through the outbox like any other (so WeCom's
second delivery of a msgid is one row, and a user's rating is handled after the answer it rates)
and the worker records it with ``record_aibot_feedback``: a later rating replaces the earlier
(the row keeps ``message_id`` unique), a withdrawal sets it to 0 (counted neither way), the
reason codes go in ``reasons`` and the free text is sealed as a ``FeedbackComment`` of that
answer. Only the asker can rate, only a model answer of the AI bot, and every refusal (an unknown
or forged id, another employee, a malformed event) is a log line, never an error.

The dashboard shows satisfaction by day, department, model and channel; the worst-rated answers
(👎, the newest first) are listed for the admin role only, question and answer decrypted for it
alone.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
from dataclasses import dataclass
from datetime import date, datetime

from sqlalchemy import case, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.audit.chain import EventType
from app.db import utcnow
from app.models import AnswerRating, FeedbackComment, InboundMessage, MessageStatus, UsageRecord

log = logging.getLogger(__name__)

CARD_EVENT = "template_card_event"
UP, DOWN = "feedback_up", "feedback_down"
RATINGS = {UP: 1, DOWN: -1}
COMMENTS_TABLE = FeedbackComment.__tablename__
MAX_COMMENT_CHARS = 2000
_TASK_ID = re.compile(r"fb-([0-9]{1,19})-([0-9a-f]{16})")
_PURPOSE = "feedback-task"

# The AI bot's feedback_event (app/wecom/aibot.py parses it): WeCom's types and reason codes.
AIBOT_EVENT = "feedback_event"
AIBOT_ACCURATE, AIBOT_INACCURATE, AIBOT_WITHDRAWN = 1, 2, 3
AIBOT_RATINGS = {AIBOT_ACCURATE: 1, AIBOT_INACCURATE: -1, AIBOT_WITHDRAWN: 0}
REASONS = {1: "与问题无关 irrelevant", 2: "内容不完整 incomplete", 3: "内容有错误 wrong",
           4: "数据分析错误 data analysis error"}
FEEDBACK_ID_MAX_BYTES = 256

CARD_TITLE = "这个回答有帮助吗？"
CARD_DESC = "Was this answer helpful?"
# The card's 👎 reasons: a button_selection (WeCom's drop-down of a button_interaction card, at
# most 10 options, the first selected unless another is) whose choice comes back with the click
# in SelectedItems; the codes are the AI bot's (REASONS), so both channels' reasons count alike.
REASON_KEY = "fb_reason"
NO_REASON = "0"
CARD_REASONS = {NO_REASON: "👎 原因（可不选）", "1": "与问题无关", "2": "内容不完整", "3": "内容有错误"}
RATED_TEXT = {1: "已评价：👍 有帮助 · thanks", -1: "已评价：👎 没帮助 · thanks"}


# -- the card -------------------------------------------------------------------------------------
def task_id(blind_index, message_id: int) -> str:
    """The card's task id for ``message_id`` (WeCom: at most 128 of ``[0-9a-zA-Z_-@]``)."""
    return f"fb-{int(message_id)}-{blind_index(_PURPOSE, str(int(message_id)))[:16]}"


def message_of(blind_index, task: str) -> int | None:
    """The message id a task id names, or None when it is not one of ours (or forged)."""
    match = _TASK_ID.fullmatch(task or "")
    if not match:
        return None
    message_id, check = match.groups()
    for digest in blind_index.candidates(_PURPOSE, message_id):
        if hmac.compare_digest(digest[:16], check):
            return int(message_id)
    return None


def build_card(task: str) -> dict:
    """The ``template_card`` object: a button_interaction card with 👍 and 👎, and the 👎's
    reasons as its drop-down (sent with the click)."""
    return {
        "card_type": "button_interaction",
        "main_title": {"title": CARD_TITLE, "desc": CARD_DESC},
        "task_id": task,
        "button_selection": {"question_key": REASON_KEY, "title": "原因 Why",
                             "option_list": [{"id": k, "text": v} for k, v in CARD_REASONS.items()],
                             "selected_id": NO_REASON},
        "button_list": [
            {"text": "👍 有帮助", "style": 1, "key": UP},
            {"text": "👎 没帮助", "style": 2, "key": DOWN},
        ],
    }


def rating_of(event_key: str) -> int | None:
    """+1, -1, or None for a key that is not one of the card's buttons."""
    return RATINGS.get((event_key or "").strip())


@dataclass(frozen=True)
class CardClick:
    message_id: int
    rating: int
    response_code: str
    reasons: tuple[int, ...] = ()  # a 👎's reason codes (REASONS), from the card's drop-down


def parse_click(blind_index, payload: dict) -> CardClick | None:
    """A ``template_card_event``'s stored payload as a click on a feedback card, else None."""
    message_id = message_of(blind_index, str(payload.get("task_id") or ""))
    rating = rating_of(str(payload.get("event_key") or ""))
    if message_id is None or rating is None:
        return None
    chosen = (payload.get("selected") or {}).get(REASON_KEY) if isinstance(payload.get("selected"), dict) else None
    reasons = tuple(sorted({int(c) for c in (chosen or ()) if isinstance(c, str) and c in CARD_REASONS
                            and c != NO_REASON})) if rating < 0 else ()
    return CardClick(message_id, rating, str(payload.get("response_code") or ""), reasons)


# -- the AI bot's feedback id and event -------------------------------------------------------------
def feedback_id(blind_index, message_id: int) -> str:
    """The AI bot reply's ``feedback.id`` for ``message_id``: the card's keyed task id (opaque to
    WeCom, ASCII, far below its 256 bytes; no user id or text in it)."""
    return task_id(blind_index, message_id)


def offers_feedback(settings, question: str | None) -> bool:
    """Whether an AI bot question's first reply carries a feedback id: feedback on
    (``FEEDBACK_CARDS``) and the question not a command (``/help`` is not a model answer)."""
    if not getattr(settings, "feedback_cards", True):
        return False
    return not (question or "").strip().startswith(("/", "／"))


@dataclass(frozen=True)
class AibotFeedback:
    message_id: int
    kind: int  # AIBOT_ACCURATE, AIBOT_INACCURATE, AIBOT_WITHDRAWN
    reasons: tuple[int, ...]
    comment: str

    @property
    def rating(self) -> int:
        return AIBOT_RATINGS[self.kind]


def aibot_problem(message) -> str | None:
    """Why a parsed ``feedback_event`` (``app.wecom.aibot.AibotMessage``) cannot be recorded, or
    None; checked where it arrives, so that a malformed event is a log line, not an outbox row.
    Whether the id is one of ours is the worker's question (``parse_aibot_feedback``)."""
    if not message.msg_id:
        return "no msgid (needed to drop WeCom's second delivery)"
    if not message.from_user:
        return "no from.userid"
    if not message.feedback_id:
        return "no feedback_event.id"
    if len(message.feedback_id.encode()) > FEEDBACK_ID_MAX_BYTES:
        return "feedback_event.id longer than 256 bytes"
    if message.feedback_type not in AIBOT_RATINGS:
        return f"feedback_event.type {message.feedback_type} is not 1, 2 or 3"
    return None


def parse_aibot_feedback(blind_index, payload: dict) -> AibotFeedback | str:
    """An accepted ``feedback_event``'s stored payload as the rating of one of our answers, or
    a sentence saying why not (an id that is not ours, or forged; a type out of range)."""
    message_id = message_of(blind_index, str(payload.get("feedback_id") or ""))
    if message_id is None:
        return "unknown feedback id"
    kind = payload.get("feedback_type")
    if type(kind) is not int or kind not in AIBOT_RATINGS:
        return "feedback type out of range"
    reasons = payload.get("feedback_reasons") or ()
    codes = tuple(sorted({r for r in reasons if type(r) is int and r in REASONS})) \
        if kind == AIBOT_INACCURATE and isinstance(reasons, list | tuple) else ()
    comment = payload.get("content") if kind == AIBOT_INACCURATE else ""
    return AibotFeedback(message_id, kind, codes,
                         comment.strip()[:MAX_COMMENT_CHARS] if isinstance(comment, str) else "")


def reason_labels(reasons: str) -> list[str]:
    """``"1,3"`` -> the reasons' names, for the dashboard."""
    return [REASONS.get(int(code), code) for code in (reasons or "").split(",") if code.isdigit()]


# -- storing ----------------------------------------------------------------------------------------
class Recorded:
    STORED = "stored"
    DUPLICATE = "duplicate"  # already rated: WeCom's retry, or a second click
    UNKNOWN = "unknown"  # no such message, or not this employee's
    CHANGED = "changed"  # the AI bot: a new rating replaced the earlier one
    WITHDRAWN = "withdrawn"  # the AI bot: the rating was withdrawn (now 0)
    NOT_RATED = "not_rated"  # the AI bot: a withdrawal of a rating that was never stored
    NOT_AN_ANSWER = "not_an_answer"  # the AI bot: the rated reply was no model answer of the bot


def record_rating(services, message_id: int, user_hashes: list[str] | str, rating: int,
                  tz, channel: str = "app", request_id: str | None = None,
                  reasons: tuple[int, ...] = ()) -> str:
    """Store ``rating`` (+1/-1) of the answer ``message_id`` by its own asker, once, with a 👎's
    reason codes; audited."""
    if rating not in (1, -1):
        raise ValueError("rating must be 1 or -1")
    hashes = [user_hashes] if isinstance(user_hashes, str) else list(user_hashes)
    with services.db.transaction() as session:
        message = session.get(InboundMessage, message_id)
        if message is None or message.user_hash not in hashes:
            return Recorded.UNKNOWN
        if session.scalar(select(AnswerRating.id).where(AnswerRating.message_id == message_id)):
            return Recorded.DUPLICATE
        usage = session.execute(select(UsageRecord.model, UsageRecord.department)
                                .where(UsageRecord.message_id == message_id).limit(1)).first()
        model = (usage.model if usage else None) or message.model or ""
        department = usage.department if usage else ""
        now = utcnow()
        try:
            with session.begin_nested():
                session.add(AnswerRating(message_id=message_id, rating=rating, channel=channel,
                                         user_hash=message.user_hash, department=department or "",
                                         model=model[:64], day=now.astimezone(tz).date(),
                                         created_at=now,
                                         reasons=",".join(str(r) for r in reasons if rating < 0)[:32]))
        except IntegrityError:  # a concurrent delivery of the same click won
            return Recorded.DUPLICATE
        services.audit.append(session, EventType.FEEDBACK, actor=message.user_hash,
                              request_id=request_id,
                              payload={"kind": "rating", "message_id": message_id,
                                       "rating": "up" if rating > 0 else "down", "model": model[:64],
                                       "channel": channel, **({"reasons": list(reasons)} if reasons else {})})
    _publish_head(services)
    return Recorded.STORED


def record_aibot_feedback(services, rated: AibotFeedback, user_hashes: list[str] | str, tz,
                          request_id: str | None = None) -> str:
    """Record an AI bot ``feedback_event``: the asker's 👍/👎 of the answer ``rated.message_id``
    stored, or replacing an earlier one, or withdrawn (set to 0); a 👎's reason codes with it and
    its free text sealed as a comment on that answer. Audited (without the text) unless nothing
    changed. Returns a ``Recorded`` value."""
    hashes = [user_hashes] if isinstance(user_hashes, str) else list(user_hashes)
    rating, reasons = rated.rating, ",".join(str(r) for r in rated.reasons)[:32]
    with services.db.transaction() as session:
        message = session.get(InboundMessage, rated.message_id)
        if message is None or message.user_hash not in hashes:
            return Recorded.UNKNOWN
        if message.channel != "aibot" or not message.model:
            return Recorded.NOT_AN_ANSWER
        usage = session.execute(select(UsageRecord.model, UsageRecord.department)
                                .where(UsageRecord.message_id == message.id).limit(1)).first()
        model = ((usage.model if usage else None) or message.model or "")[:64]
        department = (usage.department if usage else "") or ""
        now = utcnow()
        today = now.astimezone(tz).date()
        existing = session.scalars(select(AnswerRating).where(AnswerRating.message_id == message.id)
                                   .with_for_update()).first()
        if existing is None:
            if rating == 0:
                return Recorded.NOT_RATED
            try:
                with session.begin_nested():
                    session.add(AnswerRating(message_id=message.id, rating=rating, channel="aibot",
                                             user_hash=message.user_hash, department=department,
                                             model=model, day=today, created_at=now, reasons=reasons))
            except IntegrityError:  # a concurrent rating of the same answer won
                return Recorded.DUPLICATE
            result = Recorded.STORED
        elif (existing.rating, existing.reasons) == (rating, reasons) and not rated.comment:
            return Recorded.DUPLICATE  # the same rating again: nothing new to count or audit
        else:
            result = Recorded.WITHDRAWN if rating == 0 else Recorded.CHANGED
            existing.rating, existing.reasons, existing.day, existing.created_at = rating, reasons, today, now
        comment_id = None
        if rated.comment:
            row = FeedbackComment(message_id=message.id, user_hash=message.user_hash,
                                  department=department, day=today, created_at=now)
            session.add(row)
            session.flush()
            row.comment_enc = services.cipher.encrypt(rated.comment, COMMENTS_TABLE, "comment_enc", row.id)
            comment_id = row.id
        payload = {"kind": "rating", "message_id": message.id, "channel": "aibot", "model": model,
                   "rating": {1: "up", -1: "down", 0: "withdrawn"}[rating], "result": result}
        if rated.reasons:
            payload["reasons"] = list(rated.reasons)
        if comment_id is not None:
            payload.update(comment_id=comment_id, chars=len(rated.comment))
        services.audit.append(session, EventType.FEEDBACK, actor=message.user_hash,
                              request_id=request_id, payload=payload)
    _publish_head(services)
    return result


def store_comment(services, user_hash: str, text: str, tz, department: str = "",
                  request_id: str | None = None) -> int:
    """Seal and store a ``/feedback`` comment (tied to the user's last answer); audited. Its id."""
    text = text.strip()[:MAX_COMMENT_CHARS]
    if not text:
        raise ValueError("empty comment")
    now = utcnow()
    with services.db.transaction() as session:
        last = session.scalar(select(func.max(InboundMessage.id)).where(
            InboundMessage.user_hash == user_hash, InboundMessage.status == MessageStatus.ANSWERED,
            InboundMessage.model.is_not(None)))
        row = FeedbackComment(message_id=last, user_hash=user_hash, department=department or "",
                              day=now.astimezone(tz).date(), created_at=now)
        session.add(row)
        session.flush()
        row.comment_enc = services.cipher.encrypt(text, COMMENTS_TABLE, "comment_enc", row.id)
        services.audit.append(session, EventType.FEEDBACK, actor=user_hash, request_id=request_id,
                              payload={"kind": "comment", "comment_id": row.id, "message_id": last,
                                       "chars": len(text)})
        comment_id = row.id
    _publish_head(services)
    return comment_id


def _publish_head(services) -> None:
    try:
        services.audit.publish_head(services.db)
    except Exception:  # noqa: BLE001 - the next append or checkpoint publishes it
        log.warning("audit head not published after a feedback event")


# -- reports (the dashboard) ------------------------------------------------------------------------
def _within(since: date, until: date, department: str | None):
    conditions = [AnswerRating.day >= since, AnswerRating.day <= until]
    if department is not None:
        conditions.append(AnswerRating.department == department)
    return conditions


def satisfaction(session: Session, since: date, until: date, department: str | None = None) -> dict:
    """👍/👎 counts and the share of 👍 by day, department, model and channel (app, aibot), and
    in total; a withdrawn AI bot rating (0) counts neither way."""
    up = func.sum(case((AnswerRating.rating > 0, 1), else_=0)).label("up")
    down = func.sum(case((AnswerRating.rating < 0, 1), else_=0)).label("down")
    where = _within(since, until, department)

    def rows(column):
        result = session.execute(select(column, up, down).where(*where).group_by(column).order_by(column))
        return [_share({"key": key if not isinstance(key, datetime) else key.date(), "up": int(u or 0),
                        "down": int(d or 0)}) for key, u, d in result]

    total = session.execute(select(up, down).where(*where)).one()
    return {"total": _share({"key": "all", "up": int(total.up or 0), "down": int(total.down or 0)}),
            "days": rows(AnswerRating.day), "departments": rows(AnswerRating.department),
            "models": rows(AnswerRating.model), "channels": rows(AnswerRating.channel)}


def _share(row: dict) -> dict:
    rated = row["up"] + row["down"]
    row["rated"] = rated
    row["percent"] = round(100.0 * row["up"] / rated, 1) if rated else None
    return row


def worst_rated(session: Session, services, since: date, until: date, department: str | None = None,
                limit: int = 10, decrypt: bool = False) -> list[dict]:
    """The 👎 answers, newest first; question and answer decrypted only when ``decrypt`` (the
    admin role): otherwise only the message id, day, model and department."""
    found = session.execute(
        select(AnswerRating, InboundMessage.payload_enc, InboundMessage.reply_enc)
        .join(InboundMessage, InboundMessage.id == AnswerRating.message_id, isouter=True)
        .where(*_within(since, until, department), AnswerRating.rating < 0)
        .order_by(AnswerRating.created_at.desc(), AnswerRating.id.desc()).limit(limit))
    out = []
    for rating, payload_enc, reply_enc in found:
        item = {"message_id": rating.message_id, "day": rating.day, "model": rating.model,
                "department": rating.department, "channel": rating.channel,
                "reasons": reason_labels(rating.reasons)}
        if decrypt:
            item["question"], item["answer"] = _texts(services, rating.message_id, payload_enc, reply_enc)
        out.append(item)
    return out


def _texts(services, message_id: int, payload_enc: str | None, reply_enc: str | None) -> tuple[str, str]:
    table = InboundMessage.__tablename__
    question = answer = "(not available)"
    try:
        if payload_enc:
            question = json.loads(services.cipher.decrypt(payload_enc, table, "payload_enc", message_id)
                                  ).get("content") or "(no text)"
        if reply_enc:
            answer = services.cipher.decrypt(reply_enc, table, "reply_enc", message_id)
    except Exception:  # noqa: BLE001 - a row sealed under a retired key: say so, show the rest
        log.warning("worst-rated answer not decrypted message_id=%s", message_id)
    return question, answer
