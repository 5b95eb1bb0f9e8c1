"""The data layer along the message path, on both databases.

A signed, encrypted WeCom callback is POSTed to the real Flask app; the processor then answers
it with a fake model and a fake WeCom. The audit events, usage rows, budget block, ``/usage`` and
``keys rotate`` are checked, and a dump of every text column of every table must not contain the
message texts, the replies or the user ids.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from decimal import Decimal

import pytest
import sqlalchemy as sa
from sqlalchemy import select

from app.accounting import set_budget, set_price
from app.audit.chain import AuditLog
from app.llm import Generation, LLMError
from app.models import AuditEvent, InboundMessage, MessageStatus, UsageRecord
from app.outbox.rows import user_hash
from app.services import Services
from app.web.factory import create_app
from tests.support.env import settings_from
from worker.conversation import ConversationStore
from worker.processor import MessageProcessor

SENTINEL_TEXTS = ["SENTINEL-QUESTION-7f3a 我的工资是多少", "SENTINEL-SECOND-91bc 请假流程"]
SENTINEL_REPLY = "SENTINEL-REPLY-c0de 工资请看薪酬系统"
USER_ID = "SentinelUser9Q"


class FakeLLM:
    model_name = "glm-4"

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.calls = 0

    def generate(self, messages, params):
        self.calls += 1
        if self.fail:
            raise LLMError("model down", transient=False)
        return Generation(text=SENTINEL_REPLY, model="glm-4", prompt_tokens=1200,
                          completion_tokens=300, cached_tokens=200)


class FakeWeCom:
    def __init__(self):
        self.sent = []

    def send(self, touser, kind, content, **_):
        self.sent.append((touser, kind, content))
        return {"errcode": 0}

    def send_template_card(self, touser, card, **_):  # the 👍/👎 card (app.feedback.ratings)
        return {"errcode": 0, "response_code": "rc"}

    def get_user(self, userid):
        return {"userid": userid, "department": [7, 9], "main_department": 9}


def post_message(client, services, text: str, msg_id: int, user: str = USER_ID):
    s = services.settings
    xml = (f"<xml><ToUserName><![CDATA[{s.wecom_corp_id}]]></ToUserName>"
           f"<FromUserName><![CDATA[{user}]]></FromUserName><CreateTime>{int(time.time())}</CreateTime>"
           f"<MsgType><![CDATA[text]]></MsgType><Content><![CDATA[{text}]]></Content>"
           f"<MsgId>{msg_id}</MsgId><AgentID>{s.wecom_agent_id}</AgentID></xml>")
    return post_xml(client, services, xml)


def post_xml(client, services, xml: str):
    """POST a plaintext callback body to /wecom/callback as WeCom sends it: encrypted, signed."""
    s = services.settings
    crypto = services.wecom_crypto
    encrypt = crypto.encrypt(xml)
    timestamp, nonce = str(int(time.time())), uuid.uuid4().hex[:10]
    body = (f"<xml><ToUserName><![CDATA[{s.wecom_corp_id}]]></ToUserName>"
            f"<AgentID>{s.wecom_agent_id}</AgentID><Encrypt><![CDATA[{encrypt}]]></Encrypt></xml>")
    return client.post("/wecom/callback", data=body.encode(), headers={"User-Agent": "WeCom/Test"},
                       query_string={"msg_signature": crypto.signature(timestamp, nonce, encrypt),
                                     "timestamp": timestamp, "nonce": nonce})


@pytest.fixture
def app(services):
    return create_app(services=services)


def processor_for(services, llm):
    conversations = ConversationStore(services.redis, services.cipher, 3600, 20)
    return MessageProcessor(services, llm, FakeWeCom(), conversations)


def ids_of(services):
    with services.db.session() as session:
        return list(session.scalars(select(InboundMessage.id).order_by(InboundMessage.id)))


def events(services):
    with services.db.session() as session:
        return [(e.event_type, e.outcome) for e in session.scalars(select(AuditEvent).order_by(AuditEvent.seq))]


def test_callback_audits_in_its_transaction_and_worker_audits_the_reply(app, services):
    client = app.test_client()
    assert post_message(client, services, SENTINEL_TEXTS[0], 1).status_code == 200
    assert post_message(client, services, SENTINEL_TEXTS[0], 1).status_code == 200  # WeCom retry
    [message_id] = ids_of(services)
    with services.db.session() as session:
        event = session.scalars(select(AuditEvent)).one()
        assert event.actor == user_hash(services.blind_index, USER_ID)
        assert event.fingerprint and len(event.fingerprint) == 64 and event.request_id
        assert services.audit.payload_of(event)["message_id"] == message_id
    processor = processor_for(services, FakeLLM())
    assert processor.process(message_id).status == "done"
    assert events(services) == [("message_received", "accepted"), ("reply_sent", "sent")]
    with services.db.session() as session:
        usage = session.scalars(select(UsageRecord)).one()
    assert (usage.department, usage.prompt_tokens, usage.cached_tokens) == ("9", 1200, 200)
    assert json.loads(services.redis.get(f"member:{usage.user_hash}")) == ["9", [7, 9]]


def test_audit_failure_fails_the_callback_closed(app, services, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(AuditLog, "append_many", broken)
    response = post_message(app.test_client(), services, SENTINEL_TEXTS[0], 2)
    assert response.status_code == 503
    assert ids_of(services) == []  # the outbox row rolled back with it: WeCom will retry


def test_failed_generation_is_audited_and_releases_its_reservation(app, services):
    with services.db.transaction() as session:
        set_price(session, "glm-4", 10, 2, 30)
        set_budget(session, "global", "", "day", "100")
    post_message(app.test_client(), services, SENTINEL_TEXTS[0], 3)
    [message_id] = ids_of(services)
    processor_for(services, FakeLLM(fail=True)).process(message_id)
    assert events(services)[-1] == ("reply_failed", "failed")
    with services.db.session() as session:
        assert session.execute(sa.text("SELECT reserved FROM budget_periods")).scalar() == 0


class SilentLLM(FakeLLM):
    """A model server that reports no usage and answers under another model's name."""

    def generate(self, messages, params):
        self.calls += 1
        self.prompt = messages
        return Generation(text=SENTINEL_REPLY, model="unpriced-model", prompt_tokens=0,
                          completion_tokens=0)


def test_a_reply_without_usage_is_charged_its_estimate_at_the_configured_price(app, services):
    with services.db.transaction() as session:
        set_price(session, "glm-4", 10, 2, 30)
        set_budget(session, "global", "", "day", "100")
    post_message(app.test_client(), services, "😀🎉 𠀀𪚥 " + SENTINEL_TEXTS[0], 4)
    llm = SilentLLM()
    processor_for(services, llm).process(ids_of(services)[-1])
    with services.db.session() as session:
        usage = session.scalars(select(UsageRecord)).one()
        spent = session.execute(sa.text("SELECT spent FROM budget_periods")).scalar()
    prompt_bytes = sum(len(m["content"].encode()) for m in llm.prompt)
    assert usage.model == "glm-4"
    assert usage.prompt_tokens > prompt_bytes
    assert usage.completion_tokens >= len(SENTINEL_REPLY.encode())
    assert usage.cost == (usage.prompt_tokens * 10 + usage.completion_tokens * 30) / Decimal(10**6)
    assert spent == usage.cost * 10**6  # budget_periods.spent is in millionths


def test_budget_block_gives_a_notice_and_usage_command_reports(app, services):
    with services.db.transaction() as session:
        set_price(session, "glm-4", 10, 2, 30)
        set_budget(session, "department", "9", "month", "0.015")
    client = app.test_client()
    processor = processor_for(services, FakeLLM())
    for n, text in enumerate([SENTINEL_TEXTS[0], SENTINEL_TEXTS[1], "/usage"]):
        post_message(client, services, text, 10 + n)
        processor.process(ids_of(services)[-1])
    sent = [content for _, _, content in processor.wecom.sent]
    assert sent[0] == SENTINEL_REPLY
    assert "预算已用完" in sent[1] and "department" in sent[1]
    assert "0.0194 / 0.0150" in sent[2] and "本月" in sent[2]
    assert processor.llm.calls == 1
    assert ("budget_block", "blocked") in events(services)
    alerts = [e for e in events(services) if e[0] == "budget_alert"]
    assert [o for _, o in alerts] == ["50%", "80%", "100%"]


def all_text(engine) -> str:
    """Every text-ish column of every table, as a database dump would show it."""
    inspector = sa.inspect(engine)
    columns = [(table, column["name"]) for table in inspector.get_table_names()
               for column in inspector.get_columns(table)
               if isinstance(column["type"], sa.String | sa.Text)]
    assert ("audit_events", "payload_enc") in columns and ("usage_records", "user_hash") in columns
    chunks = []
    with engine.connect() as conn:
        for table, column in columns:
            chunks += [str(v) for v in conn.execute(sa.text(f'SELECT "{column}" FROM "{table}"')).scalars()]
    return "\n".join(chunks)


def test_database_holds_no_message_text_reply_or_user_id(app, services, env):
    client = app.test_client()
    processor = processor_for(services, FakeLLM())
    for n, text in enumerate(SENTINEL_TEXTS):
        post_message(client, services, text, 100 + n)
        processor.process(ids_of(services)[-1])
    # A knowledge base document: its title, file name, text and sections are sealed, its index
    # holds keyed term hashes only.
    from app.knowledge.store import KnowledgeStore

    KnowledgeStore(services).add(
        "# SENTINEL-KB-TITLE 手册\n\n## SENTINEL-KB-SECTION\n\nSENTINEL-KB-TEXT 机密条款 bonus.\n".encode(),
        "SENTINEL-KB 手册", filename="SENTINEL-KB.md", departments=[9])
    # Rotation rewrites every sealed column; the dump must stay clean after it too.
    rotated = rotate_with_new_primary(services, env)
    dump = all_text(services.db.engine)
    if services.db.engine.dialect.name == "postgresql":
        import subprocess

        url = services.db.url.replace("postgresql+psycopg", "postgresql")
        dump += subprocess.run(["pg_dump", "--data-only", url], capture_output=True, text=True,
                               check=True, timeout=60).stdout
    else:
        path = services.db.url.removeprefix("sqlite:///")
        for name in (path, path + "-wal"):
            if os.path.exists(name):
                with open(name, "rb") as f:
                    dump += f.read().decode("utf-8", "replace")
    assert len(dump) > 1000
    for secret in [*SENTINEL_TEXTS, SENTINEL_REPLY, USER_ID, "SENTINEL"]:
        assert secret not in dump
    assert rotated.cipher.primary_id in dump


def rotate_with_new_primary(services, env) -> Services:
    import base64

    new_keys = "k9:" + base64.b64encode(os.urandom(32)).decode() + "," + env["DATA_KEYS"]
    rotated = Services(settings_from(env, data_keys=new_keys), services.db)
    result = create_app(services=rotated).test_cli_runner().invoke(args=["keys", "rotate", "--batch-size", "1"])
    assert result.exit_code == 0, result.output
    return rotated


def test_keys_rotate_reencrypts_everything_and_reads_back(app, services, env):
    client = app.test_client()
    processor = processor_for(services, FakeLLM())
    for n, text in enumerate(SENTINEL_TEXTS):
        post_message(client, services, text, 200 + n)
        processor.process(ids_of(services)[-1])
    rotated = rotate_with_new_primary(services, env)
    only_new = Services(settings_from(env, data_keys=rotated.settings.data_keys.get_secret_value().split(",")[0]),
                        services.db)
    with services.db.session() as session:
        rows = list(session.scalars(select(InboundMessage).order_by(InboundMessage.id)))
        for row, text in zip(rows, SENTINEL_TEXTS, strict=True):
            assert row.status == MessageStatus.ANSWERED
            assert only_new.cipher.decrypt(row.user_enc, "inbound_messages", "user_enc", row.id) == USER_ID
            assert text in only_new.cipher.decrypt(row.payload_enc, "inbound_messages", "payload_enc", row.id)
            assert only_new.cipher.decrypt(row.reply_enc, "inbound_messages", "reply_enc", row.id) == SENTINEL_REPLY
        report = only_new.audit.verify(session)
        assert report.ok, report.issues
        for event in session.scalars(select(AuditEvent)):
            assert event.payload_enc.startswith("v1:k9:")
            only_new.audit.payload_of(event)
        last = session.scalars(select(AuditEvent).order_by(AuditEvent.seq.desc()).limit(1)).one()
        assert last.event_type == "key_rotation"
        assert only_new.audit.payload_of(last)["rewritten"]["inbound_messages.user_enc"] == 2
    # A second run finds nothing left to do.
    again = create_app(services=rotated).test_cli_runner().invoke(args=["keys", "rotate"])
    assert again.exit_code == 0, again.output
    assert again.output.splitlines()[:-1] == ["audit_events.payload_enc: 0 re-encrypted"]


def test_a_sealed_value_moved_to_another_row_does_not_decrypt(app, services):
    from app.security import FieldDecryptError

    client = app.test_client()
    post_message(client, services, SENTINEL_TEXTS[0], 300)
    post_message(client, services, SENTINEL_TEXTS[1], 301, user="OtherUser")
    first, second = ids_of(services)
    with services.db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE inbound_messages SET payload_enc = "
                             "(SELECT payload_enc FROM inbound_messages WHERE id = :a) WHERE id = :b"),
                     {"a": first, "b": second})
    with services.db.session() as session:
        row = session.get(InboundMessage, second)
        with pytest.raises(FieldDecryptError):
            services.cipher.decrypt(row.payload_enc, "inbound_messages", "payload_enc", row.id)


def test_migrations_go_down_and_up_again(database_url):
    from app import migrate

    migrate.downgrade(database_url, "0001")
    engine = sa.create_engine(database_url)
    assert "audit_events" not in sa.inspect(engine).get_table_names()
    engine.dispose()
    migrate.upgrade(database_url)
    engine = sa.create_engine(database_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT last_seq FROM audit_chain WHERE id = 1")).scalar() == 0
    engine.dispose()
