"""Feedback on answers along the real path, on SQLite and PostgreSQL: a signed callback is
answered by the processor (fake model, fake WeCom), the 👍/👎 card follows the answer, its
``template_card_event`` (signed and encrypted like every callback) stores the rating once,
audited, and updates the card; ``/feedback`` comments are sealed; no text reaches the database in
clear; the dashboard's reports count the ratings."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from sqlalchemy import func, select

from app.feedback import ratings as feedback
from app.models import AnswerRating, AuditEvent, FeedbackComment, InboundMessage
from app.outbox.rows import user_hash
from tests.worker.test_processor_data import (
    SENTINEL_REPLY,
    USER_ID,
    FakeLLM,
    ids_of,
    post_message,
    post_xml,
)
from worker.conversation import ConversationStore
from worker.processor import MessageProcessor

COMMENT = "SENTINEL-COMMENT-5e1f 回答里的报销流程过时了"
QUESTION = "SENTINEL-QUESTION-aa01 差旅报销怎么走"


class CardWeCom:
    """A fake WeCom that records texts, cards and card updates."""

    def __init__(self):
        self.sent, self.cards, self.updates = [], [], []

    def send(self, touser, kind, content, **_):
        self.sent.append((touser, kind, content))
        return {"errcode": 0}

    def send_template_card(self, touser, card, **_):
        self.cards.append((touser, card))
        return {"errcode": 0, "response_code": "rc-send"}

    def update_template_card(self, userids, response_code, *, replace_name):
        self.updates.append((userids, response_code, replace_name))
        return {"errcode": 0}

    def get_user(self, userid):
        return {"userid": userid, "department": [7, 9], "main_department": 9}


@pytest.fixture
def app(services):
    from app.web.factory import create_app

    return create_app(services=services)


def post_card_event(client, services, task_id: str, key: str, create_time: int,
                    response_code: str = "rc-click", user: str = USER_ID):
    s = services.settings
    xml = (f"<xml><ToUserName><![CDATA[{s.wecom_corp_id}]]></ToUserName>"
           f"<FromUserName><![CDATA[{user}]]></FromUserName><CreateTime>{create_time}</CreateTime>"
           f"<MsgType><![CDATA[event]]></MsgType><Event><![CDATA[template_card_event]]></Event>"
           f"<EventKey><![CDATA[{key}]]></EventKey><TaskId><![CDATA[{task_id}]]></TaskId>"
           f"<CardType><![CDATA[button_interaction]]></CardType>"
           f"<ResponseCode><![CDATA[{response_code}]]></ResponseCode>"
           f"<AgentID>{s.wecom_agent_id}</AgentID></xml>")
    return post_xml(client, services, xml)


def processor_for(services, wecom):
    conversations = ConversationStore(services.redis, services.cipher, 3600, 20)
    return MessageProcessor(services, FakeLLM(), wecom, conversations)


def feedback_events(services) -> list[dict]:
    with services.db.session() as session:
        rows = session.scalars(select(AuditEvent).where(AuditEvent.event_type == "feedback")
                               .order_by(AuditEvent.seq)).all()
        return [services.audit.payload_of(row) for row in rows]


def test_a_click_on_the_card_stores_the_rating_once_audited_and_updates_the_card(app, services):
    client = app.test_client()
    wecom = CardWeCom()
    processor = processor_for(services, wecom)
    assert post_message(client, services, QUESTION, 41).status_code == 200
    [answer_id] = ids_of(services)
    assert processor.process(answer_id).status == "done"
    assert wecom.sent[-1][2] == SENTINEL_REPLY
    [(touser, card)] = wecom.cards
    assert touser == USER_ID and card["card_type"] == "button_interaction"
    assert feedback.message_of(services.blind_index, card["task_id"]) == answer_id

    created = int(time.time())
    for _ in range(2):  # WeCom retries the same event: one outbox row
        assert post_card_event(client, services, card["task_id"], feedback.DOWN, created).status_code == 200
    # a second click (a later event) is accepted, but stores nothing new
    assert post_card_event(client, services, card["task_id"], feedback.UP, created + 1,
                           response_code="rc-second").status_code == 200
    for message_id in ids_of(services)[1:]:
        assert processor.process(message_id).status == "done"
    assert len(ids_of(services)) == 3
    with services.db.session() as session:
        [rating] = session.scalars(select(AnswerRating)).all()
        assert (rating.message_id, rating.rating, rating.model, rating.department) == (answer_id, -1, "glm-4", "9")
        assert session.get(InboundMessage, answer_id).user_hash == rating.user_hash
    assert [e["rating"] for e in feedback_events(services)] == ["down"]
    assert wecom.updates[0] == ([USER_ID], "rc-click", feedback.RATED_TEXT[-1])
    assert not wecom.sent[1:]  # a click gets no text reply

    with services.db.reader() as session:
        today = rating.day
        report = feedback.satisfaction(session, today, today)
        worst = feedback.worst_rated(session, services, today, today, decrypt=True)
        hidden = feedback.worst_rated(session, services, today, today)
    assert report["total"] == {"key": "all", "up": 0, "down": 1, "rated": 1, "percent": 0.0}
    assert [r["key"] for r in report["models"]] == ["glm-4"]
    assert [r["key"] for r in report["departments"]] == ["9"]
    assert (worst[0]["question"], worst[0]["answer"]) == (QUESTION, SENTINEL_REPLY)
    assert "question" not in hidden[0] and "answer" not in hidden[0]


def test_a_forged_or_foreign_click_stores_nothing(app, services):
    client = app.test_client()
    wecom = CardWeCom()
    processor = processor_for(services, wecom)
    assert post_message(client, services, QUESTION, 42).status_code == 200
    [answer_id] = ids_of(services)
    processor.process(answer_id)
    task = wecom.cards[0][1]["task_id"]
    forged = f"fb-{answer_id}-{'0' * 16}"
    created = int(time.time())
    post_card_event(client, services, forged, feedback.UP, created)
    post_card_event(client, services, task, feedback.UP, created + 1, user="SomeoneElse")
    for message_id in ids_of(services)[1:]:
        processor.process(message_id)
    with services.db.session() as session:
        assert session.scalar(select(func.count()).select_from(AnswerRating)) == 0
    assert not wecom.updates and not feedback_events(services)


def test_feedback_comment_is_sealed_audited_and_never_in_clear(app, services, database_url):
    client = app.test_client()
    wecom = CardWeCom()
    processor = processor_for(services, wecom)
    assert post_message(client, services, QUESTION, 43).status_code == 200
    assert post_message(client, services, f"/feedback {COMMENT}", 44).status_code == 200
    for message_id in ids_of(services):
        assert processor.process(message_id).status == "done"
    assert "Thanks for your feedback" in wecom.sent[-1][2]
    assert len(wecom.cards) == 1  # the command's answer is not a model answer: no card
    answer_id = ids_of(services)[0]
    with services.db.session() as session:
        [row] = session.scalars(select(FeedbackComment)).all()
        assert row.message_id == answer_id and row.department == "9"
        assert services.cipher.decrypt(row.comment_enc, "feedback_comments", "comment_enc", row.id) == COMMENT
    [event] = feedback_events(services)
    assert event["kind"] == "comment" and event["chars"] == len(COMMENT) and COMMENT not in str(event)
    # the sentinel: no question, answer, comment or user id in clear in any table
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            for table in sa.inspect(engine).get_table_names():
                dump = " ".join(str(v) for row in conn.execute(sa.text(f'SELECT * FROM "{table}"'))
                                for v in row)
                for secret in (COMMENT, "SENTINEL-COMMENT", QUESTION, SENTINEL_REPLY, USER_ID):
                    assert secret not in dump, (table, secret)
    finally:
        engine.dispose()


def test_rotate_index_moves_the_feedback_rows_to_the_current_key(env):
    from app.security.index_rotation import rotate_index
    from tests.app.security.test_blind_index_rotation import NEW, OLD, accept, services_with

    old = services_with(env, OLD)
    message_id = accept(old, 9001).id
    assert feedback.record_rating(old, message_id, user_hash(old.blind_index, "zhangwei"), 1,
                                  old.settings.timezone) == feedback.Recorded.STORED
    feedback.store_comment(old, user_hash(old.blind_index, "zhangwei"), "评论", old.settings.timezone)
    both = services_with(env, f"{NEW},{OLD}")
    counts = rotate_index(both)
    assert counts["answer_ratings.user_hash"] == 1 and counts["feedback_comments.user_hash"] == 1
    current = user_hash(services_with(env, NEW).blind_index, "zhangwei")
    with both.db.session() as session:
        assert session.scalar(select(AnswerRating.user_hash)) == current
        assert session.scalar(select(FeedbackComment.user_hash)) == current
