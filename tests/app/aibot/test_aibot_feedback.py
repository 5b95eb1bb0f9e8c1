"""The AI bot's own 👍/👎 along the real path, on SQLite and PostgreSQL: an encrypted, signed
callback to ``/wecom/aibot`` is answered with a first stream reply carrying ``feedback.id``; the
processor answers it (a fake streaming model); the ``feedback_event`` callback (WeCom's second
delivery of the same msgid included) is one outbox row, and the worker stores the rating for the
asker's answer, changes it, withdraws it (0: counted neither way), keeps a 👎's reason codes and
seals its free text; an unknown or forged id, another employee's rating and a malformed event are
log lines, never an error; no text reaches the database in clear; the dashboard counts them."""

from __future__ import annotations

import json
import logging
import time
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy import select

from app.feedback import ratings as feedback
from app.llm import Generation, StreamDelta
from app.models import AnswerRating, FeedbackComment, InboundMessage, MessageStatus
from app.services import Services
from app.web.factory import create_app
from app.wecom import aibot
from tests.app.feedback.test_feedback_path import feedback_events
from tests.worker.test_processor_data import USER_ID, FakeWeCom, ids_of
from worker.conversation import ConversationStore
from worker.processor import MessageProcessor

QUESTION = "SENTINEL-BOTQ-41d2 差旅报销要几天"
REPLY = "SENTINEL-BOTA-9e07 三个工作日"
COMMENT = "SENTINEL-BOTC-77aa 不是三天，是五天"
OTHER_USER = "SomeoneElse"


class StreamLLM:
    model_name = "glm-4"

    def stream(self, messages, params):
        yield StreamDelta(REPLY[:10])
        yield StreamDelta("", final=Generation(text=REPLY, model="glm-4", prompt_tokens=50,
                                               completion_tokens=20))

    def generate(self, messages, params):
        return Generation(text=REPLY, model="glm-4", prompt_tokens=50, completion_tokens=20)


@pytest.fixture
def app(services, monkeypatch):
    app = create_app(services=services)
    monkeypatch.setattr(services.publisher, "send", lambda *a, **k: None)
    monkeypatch.setattr(services.publisher, "send_many", lambda *a, **k: None)
    return app


def post_aibot(client, services, body: dict):
    """POST a plaintext AI bot callback as WeCom does: encrypted, signed; the decrypted reply."""
    crypto = services.aibot_crypto
    encrypt = crypto.encrypt(json.dumps(body, ensure_ascii=False))
    timestamp, nonce = str(int(time.time())), uuid.uuid4().hex[:10]
    resp = client.post("/wecom/aibot", data=json.dumps({"encrypt": encrypt}),
                       content_type="application/json",
                       query_string={"msg_signature": crypto.signature(timestamp, nonce, encrypt),
                                     "timestamp": timestamp, "nonce": nonce})
    return resp, (aibot.decrypt_reply(crypto, resp.data) if resp.data.strip() else None)


def question(msgid: str, text: str = QUESTION, user: str = USER_ID) -> dict:
    return {"msgid": msgid, "aibotid": "aib1", "chattype": "single", "from": {"userid": user},
            "msgtype": "text", "text": {"content": text}}


def rating(fid, kind, msgid: str | None = None, user: str = USER_ID, **extra) -> dict:
    return {"msgid": uuid.uuid4().hex if msgid is None else msgid, "create_time": int(time.time()), "aibotid": "aib1",
            "chattype": "single", "from": {"userid": user}, "msgtype": "event",
            "event": {"eventtype": "feedback_event", "feedback_event": {"id": fid, "type": kind, **extra}}}


def processor_for(services):
    conversations = ConversationStore(services.redis, services.cipher, 3600, 20)
    return MessageProcessor(services, StreamLLM(), FakeWeCom(), conversations)


def run_all(processor, services) -> None:
    for message_id in ids_of(services):
        processor.process(message_id)


def ratings(services) -> list[tuple]:
    with services.db.session() as session:
        return [(r.message_id, r.rating, r.channel, r.reasons, r.model)
                for r in session.scalars(select(AnswerRating).order_by(AnswerRating.id))]


def test_a_rated_ai_bot_answer_is_stored_changed_withdrawn_and_counted(app, services, database_url):
    client = app.test_client()
    processor = processor_for(services)
    resp, reply = post_aibot(client, services, question("bot-q1"))
    assert resp.status_code == 200
    [answer_id] = ids_of(services)
    fid = reply["stream"]["feedback"]["id"]  # the first reply opts in to WeCom's 👍/👎
    assert fid == feedback.feedback_id(services.blind_index, answer_id) and reply["stream"]["finish"] is False
    _, again = post_aibot(client, services, question("bot-q1"))  # WeCom's retry: its first reply
    assert again["stream"]["feedback"] == {"id": fid}
    run_all(processor, services)
    _, refreshed = post_aibot(client, services, {"msgid": "r1", "msgtype": "stream",
                                                  "stream": {"id": reply["stream"]["id"]}})
    assert refreshed["stream"]["finish"] and refreshed["stream"]["content"] == REPLY
    assert "feedback" not in refreshed["stream"]  # the first reply only

    # 👎 with reasons and free text, delivered twice by WeCom: one row, one rating, one comment
    down = rating(fid, 2, "ev-down", content=COMMENT, inaccurate_reason_list=[3, 1])
    for _ in range(2):
        resp, body = post_aibot(client, services, down)
        assert resp.status_code == 200 and body is None
    run_all(processor, services)
    assert ratings(services) == [(answer_id, -1, "aibot", "1,3", "glm-4")]
    with services.db.session() as session:
        [comment] = session.scalars(select(FeedbackComment)).all()
        assert comment.message_id == answer_id
        assert services.cipher.decrypt(comment.comment_enc, "feedback_comments", "comment_enc",
                                       comment.id) == COMMENT
        events = session.scalars(select(InboundMessage).where(InboundMessage.msg_type == "event")).all()
        assert [(e.event, e.status) for e in events] == [("feedback_event", MessageStatus.IGNORED)]
    with services.db.reader() as session:
        day = session.scalar(select(AnswerRating.day))
        report = feedback.satisfaction(session, day, day)
        [worst] = feedback.worst_rated(session, services, day, day, decrypt=True)
    assert report["total"]["down"] == 1 and [r["key"] for r in report["channels"]] == ["aibot"]
    assert (worst["question"], worst["answer"], worst["channel"]) == (QUESTION, REPLY, "aibot")
    assert worst["reasons"] == [feedback.REASONS[1], feedback.REASONS[3]]

    # changed to 👍, then withdrawn: counted neither way; each audited, without any text
    post_aibot(client, services, rating(fid, 1))
    run_all(processor, services)
    assert ratings(services) == [(answer_id, 1, "aibot", "", "glm-4")]
    post_aibot(client, services, rating(fid, 3))
    run_all(processor, services)
    assert ratings(services) == [(answer_id, 0, "aibot", "", "glm-4")]
    with services.db.reader() as session:
        report = feedback.satisfaction(session, day, day)
        assert (report["total"]["up"], report["total"]["down"]) == (0, 0)
        assert feedback.worst_rated(session, services, day, day) == []
    audited = feedback_events(services)
    assert [(e["rating"], e["result"], e.get("reasons")) for e in audited] == [
        ("down", "stored", [1, 3]), ("up", "changed", None), ("withdrawn", "withdrawn", None)]
    assert audited[0]["chars"] == len(COMMENT) and COMMENT not in str(audited)

    # no question, answer, comment or user id in clear in any table
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            for table in sa.inspect(engine).get_table_names():
                dump = " ".join(str(v) for row in conn.execute(sa.text(f'SELECT * FROM "{table}"'))
                                for v in row)
                for secret in (COMMENT, "SENTINEL-BOTC", QUESTION, REPLY, USER_ID):
                    assert secret not in dump, (table, secret)
    finally:
        engine.dispose()


def test_foreign_unknown_and_malformed_ratings_store_nothing_and_never_fail(app, services, caplog):
    client = app.test_client()
    processor = processor_for(services)
    _, reply = post_aibot(client, services, question("bot-q2"))
    _, command = post_aibot(client, services, question("bot-q3", "/help"))
    assert "feedback" not in command["stream"]  # a command's reply is no model answer: no thumbs
    run_all(processor, services)
    fid = reply["stream"]["feedback"]["id"]
    [answer_id, help_id] = ids_of(services)
    caplog.set_level(logging.INFO)
    sent = [rating(fid, 1, user=OTHER_USER),  # another employee (a group member, say)
            rating(f"fb-{answer_id}-{'0' * 16}", 1),  # forged
            rating(feedback.feedback_id(services.blind_index, 10**9), 2),  # no such answer
            rating(feedback.feedback_id(services.blind_index, help_id), 1),  # not a model answer
            rating(fid, 3)]  # withdrawing what was never rated
    malformed = [rating(fid, 7), rating("", 1), rating(fid, 1, msgid=""),
                 {"msgid": "x", "msgtype": "event", "from": {"userid": USER_ID},
                  "event": {"eventtype": "feedback_event", "feedback_event": ["nonsense"]}}]
    for body in sent + malformed:
        resp, answer = post_aibot(client, services, body)
        assert resp.status_code == 200 and answer is None, body
    assert len(ids_of(services)) == 2 + len(sent)  # the malformed ones never reached the outbox
    run_all(processor, services)
    assert ratings(services) == [] and not feedback_events(services)
    with services.db.session() as session:
        assert session.scalar(select(sa.func.count()).select_from(FeedbackComment)) == 0
    logged = caplog.text
    assert "feedback_event ignored: feedback_event.type 7 is not 1, 2 or 3" in logged
    assert "feedback_event ignored: no feedback_event.id" in logged
    assert "feedback_event ignored: no msgid" in logged
    assert "not recorded" in logged and "unknown feedback id" in logged
    assert "not this employee's" in logged and "not a model answer" in logged
    assert "result=not_rated" in logged


def test_the_rate_limit_notice_for_a_stream_closed_at_the_deadline_is_recorded(services, db, monkeypatch):
    """Over the limit, the notice is due; meanwhile the callback closed the stream at WeCom's
    deadline: the row is rate_limited with the stream's reason, not a crash of the task."""
    limited = Services(services.settings.model_copy(update={"wecom_user_rate_limit": "1/min"}), db)
    app = create_app(services=limited)
    monkeypatch.setattr(limited.publisher, "send", lambda *a, **k: None)
    monkeypatch.setattr(limited.publisher, "send_many", lambda *a, **k: None)
    client = app.test_client()
    post_aibot(client, limited, question("bot-limit-1"))
    _, second = post_aibot(client, limited, question("bot-limit-2"))
    first_id, second_id = ids_of(limited)
    processor = processor_for(limited)
    stream_id, check = second["stream"]["id"], processor.user_limit.check

    def over_and_closed(user_hash, message_id):
        decision = check(user_hash, message_id)
        if message_id == second_id:  # the callback, at the deadline, gives up on this one
            assert limited.streams.write(stream_id, second_id, time.time(), "timed out", True)
        return decision

    monkeypatch.setattr(processor.user_limit, "check", over_and_closed)
    processor.process(first_id)  # answers it, then the same employee's next message
    with limited.db.session() as session:
        rows = {r.id: (r.status, r.failure_reason) for r in session.scalars(select(InboundMessage))}
    assert rows[first_id] == (MessageStatus.ANSWERED, None)
    assert rows[second_id] == (MessageStatus.RATE_LIMITED, "aibot: stream closed by the callback at the deadline")
    assert limited.streams.get(stream_id).text == "timed out"  # the callback's words stay


def test_migration_0011_adds_the_reasons_and_is_reversible(database_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from app import migrate
    from app.db import Base

    def columns() -> set[str]:
        engine = sa.create_engine(database_url)
        try:
            return {c["name"] for c in sa.inspect(engine).get_columns("answer_ratings")}
        finally:
            engine.dispose()

    assert "reasons" in columns()
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert [d for d in diff if "answer_ratings" in repr(d)] == []
    finally:
        engine.dispose()
    migrate.downgrade(database_url, "0010")
    assert "reasons" not in columns() and "rating" in columns()
    migrate.upgrade(database_url)
    assert "reasons" in columns()
