"""A reasoning model's thinking never reaches an employee, on both databases.

The processor answers through the real ``openai`` backend, pointed at the fake model server
answering as GLM-4.5+ does (the thinking inline in ``content``, after a ``<think>`` the template
opened, or apart as ``reasoning_content``; see ``tests/support/openai_server.py``). What WeCom is
sent, on ``message/send`` and on every write of an AI bot stream, must hold the answer and none of
the thinking; the usage row still counts every generated token; a reply that was all thinking
(``max_tokens`` reached inside it) gives the employee the failure notice, not an empty message.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from app.llm import OpenAIBackend
from app.models import AuditEvent, InboundMessage, MessageStatus, UsageRecord
from app.outbox import rows
from app.web.factory import create_app
from app.wecom.aibot import AibotMessage
from tests.support.openai_server import THINKING, FakeOpenAIServer, written
from tests.worker.test_processor_data import USER_ID, FakeWeCom, ids_of, post_message
from worker.conversation import ConversationStore
from worker.processor import FAILURE_NOTICE, MessageProcessor

QUESTION = "年假有几天？"


@pytest.fixture(scope="module")
def model():
    server = FakeOpenAIServer().start()
    yield server
    server.stop()


@pytest.fixture
def app(services):
    return create_app(services=services)


def processor_for(services, model, reply_start="auto"):
    llm = OpenAIBackend(model.url, "fake-glm", timeout_s=10, retries=0, reply_start=reply_start)
    wecom = FakeWeCom()
    conversations = ConversationStore(services.redis, services.cipher, 3600, 20)
    return MessageProcessor(services, llm, wecom, conversations), wecom, conversations


def answer_to(text: str) -> str:
    # The fake model echoes the question (the mode marker included) after naming the user turns.
    return f"答复#1: {text}"


def usage_rows(services):
    with services.db.session() as session:
        return list(session.scalars(select(UsageRecord)))


def row_of(services, message_id):
    with services.db.session() as session:
        return session.get(InboundMessage, message_id)


@pytest.mark.parametrize("mode, reply_start", [
    ("inline", "auto"), ("inline", "answer"), ("separate", "auto"), ("separate", "answer"),
    ("prefilled", "auto"), ("prefilled", "thinking"),
])
def test_message_send_carries_the_answer_and_never_the_thinking(app, services, model, mode, reply_start):
    text = f"{QUESTION} #reasoning={mode}"
    assert post_message(app.test_client(), services, text, 1).status_code == 200
    [message_id] = ids_of(services)
    processor, wecom, conversations = processor_for(services, model, reply_start)
    assert processor.process(message_id).status == "done"
    assert [content for _, _, content in wecom.sent] == [answer_to(text)]
    assert not any(THINKING[:8] in content or "think>" in content for _, _, content in wecom.sent)
    assert row_of(services, message_id).status == MessageStatus.ANSWERED
    [usage] = usage_rows(services)
    reasoning, content, _ = written(answer_to(text), mode)
    # The thinking is paid for: the server's count (characters here), or the estimate (UTF-8
    # bytes of the answer and the thinking) where that is larger.
    assert usage.completion_tokens == max(len(reasoning) + len(content),
                                          len(answer_to(text).encode()) + len(THINKING.encode()) + 2)
    history = conversations.history(rows.user_hash(services.blind_index, USER_ID))
    assert [t["content"] for t in history] == [text, answer_to(text)]  # no thinking kept either


def test_a_reply_that_was_all_thinking_gets_the_failure_notice(app, services, model):
    text = f"{QUESTION} #reasoning=cutoff"
    assert post_message(app.test_client(), services, text, 1).status_code == 200
    [message_id] = ids_of(services)
    processor, wecom, conversations = processor_for(services, model)
    assert processor.process(message_id).status == "done"
    assert wecom.sent == [(USER_ID, "text", FAILURE_NOTICE)]
    row = row_of(services, message_id)
    assert row.status == MessageStatus.FAILED and "thinking" in row.failure_reason
    [usage] = usage_rows(services)
    # the thinking is still paid for (its bytes, more than the server's count of characters)
    assert usage.completion_tokens == max(len("<think>" + THINKING), len(THINKING.encode()) + 2)
    assert conversations.history(rows.user_hash(services.blind_index, USER_ID)) == []
    with services.db.session() as session:
        outcomes = [(e.event_type, e.outcome) for e in session.scalars(select(AuditEvent))]
    assert ("reply_failed", "failed") in outcomes


def aibot_row(services, text: str, stream_id: str) -> int:
    message = AibotMessage(msg_id=f"bot-{stream_id}", msg_type="text", from_user=USER_ID,
                           content=text, create_time=int(time.time()))
    arrival = rows.Arrival(message, "req-bot", "aibot", stream_id, enqueue=False)
    with services.db.session() as session:
        [accepted] = rows.accept_many(session, services.cipher,
                                        [rows.prepare(services.blind_index, arrival)])
        session.commit()
    services.streams.open(stream_id, accepted.id, time.time())
    return accepted.id


def recording_stream_writes(services, monkeypatch) -> list[tuple[str, bool]]:
    writes = []
    store = services.streams
    real = store.write

    def write(stream_id, message_id, started, text, finish):
        writes.append((text, finish))
        return real(stream_id, message_id, started, text, finish)

    monkeypatch.setattr(store, "write", write)
    return writes


@pytest.mark.parametrize("mode, reply_start", [
    ("inline", "answer"), ("separate", "answer"), ("prefilled", "auto"), ("prefilled", "thinking"),
])
def test_an_ai_bot_stream_never_shows_the_thinking(services, model, monkeypatch, mode, reply_start):
    monkeypatch.setattr(services.settings, "aibot_refresh_throttle_s", 0.0)
    writes = recording_stream_writes(services, monkeypatch)
    text = f"{QUESTION} #reasoning={mode}"
    message_id = aibot_row(services, text, f"S-{mode}-{reply_start}")
    processor, wecom, _ = processor_for(services, model, reply_start)
    assert processor.process(message_id).status == "done"
    assert wecom.sent == []  # the answer went to the stream
    assert writes[-1] == (answer_to(text), True)
    assert len(writes) > 2  # the stream was written as the answer grew
    assert not any(THINKING[:8] in t or "think>" in t for t, _ in writes), writes
    assert all(answer_to(text).startswith(t) for t, _ in writes)
    assert services.streams.get(f"S-{mode}-{reply_start}").text == answer_to(text)
    [usage] = usage_rows(services)
    assert usage.completion_tokens > len(THINKING)


def test_an_ai_bot_reply_that_was_all_thinking_finishes_with_the_notice(services, model, monkeypatch):
    monkeypatch.setattr(services.settings, "aibot_refresh_throttle_s", 0.0)
    writes = recording_stream_writes(services, monkeypatch)
    message_id = aibot_row(services, f"{QUESTION} #reasoning=cutoff", "S-cutoff")
    processor, _, _ = processor_for(services, model, "answer")
    assert processor.process(message_id).status == "done"
    assert writes[-1] == (FAILURE_NOTICE, True)
    assert all(t == "" for t, _ in writes[:-1])  # while it thought, the stream stayed empty
    assert row_of(services, message_id).status == MessageStatus.FAILED
