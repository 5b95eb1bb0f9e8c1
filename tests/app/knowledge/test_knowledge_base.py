"""The knowledge base on both databases: indexing, BM25, department scope through the whole
message path, re-upload and delete (atomic, audited), the "not found" reply, citations, the CLI,
and no plaintext of a document in the database."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from sqlalchemy import func, select

from app.knowledge.parsing import UploadError
from app.knowledge.prompt import is_small_talk, not_found_reply
from app.knowledge.retrieval import EVERYTHING, Retriever, is_follow_up
from app.knowledge.store import KnowledgeStore
from app.llm import Generation
from app.models import AuditEvent, KnowledgeChunk, KnowledgeDocument, KnowledgePosting
from app.web.factory import create_app
from tests.worker.test_processor_data import all_text, ids_of, post_message
from worker.conversation import ConversationStore
from worker.processor import MessageProcessor

HANDBOOK = """# 员工手册 Handbook

## 年假 Annual leave

年假：入职第一年 10 天，每满一年加 1 天，最多 15 天。Annual leave: 10 days in the first year.

## 报销 Expenses

报销请在企业微信审批里提交，费用发生后 30 天内。Submit expense claims within 30 days.

## 办公室 Offices

上海总部在张江碧波路 888 号。The Shanghai HQ is at 888 Bibo Road.

北京办公室在中关村大街 66 号。The Beijing office is at 66 Zhongguancun Street.

## VPN

VPN client Xinghe Connect; sign in with your domain account and the WeCom one-time code.
"""
SENTINEL = "SENTINEL-KB-4d2e"
FINANCE_ONLY = f"""# 财务内部 Finance only

## 奖金池 Bonus pool

奖金池口令是 {SENTINEL}，仅财务部可见。The bonus pool code is {SENTINEL}.
"""
FINANCE, SALES = 7, 9
USERS = {"alice-fin": [FINANCE], "bob-sales": [SALES]}


class PromptLLM:
    """Answers with a fixed text citing passage 1, keeping every prompt it was given."""

    model_name = "glm-4"

    def __init__(self, text="根据资料，答案见 [1]。"):
        self.text = text
        self.prompts: list[list[dict]] = []
        self.params: list = []

    def generate(self, messages, params):
        self.prompts.append(messages)
        self.params.append(params)
        return Generation(text=self.text, model="glm-4", prompt_tokens=100, completion_tokens=10)

    def stream(self, messages, params):
        from app.llm import StreamDelta

        final = self.generate(messages, params)
        for piece in (final.text[:4], final.text[4:]):
            yield StreamDelta(piece)
        yield StreamDelta("", final=final)


class DirectoryWeCom:
    def __init__(self):
        self.sent, self.lookups = [], 0

    def send(self, touser, kind, content, **_):
        self.sent.append((touser, kind, content))
        return {"errcode": 0}

    def get_user(self, userid):
        self.lookups += 1
        return {"userid": userid, "department": USERS.get(userid, []),
                "main_department": (USERS.get(userid) or [0])[0]}


@pytest.fixture
def store(services):
    return KnowledgeStore(services)


@pytest.fixture
def loaded(store):
    handbook = store.add(HANDBOOK.encode(), "员工手册", filename="handbook.md")
    finance = store.add(FINANCE_ONLY.encode(), "财务制度", filename="finance.md",
                        departments=[FINANCE])
    return handbook, finance


@pytest.fixture
def app(services):
    return create_app(services=services)


def ask(app, services, processor, user, text, msg_id):
    post_message(app.test_client(), services, text, msg_id, user=user)
    assert processor.process(ids_of(services)[-1]).status == "done"
    return processor.wecom.sent[-1][2]


def processor_with(services, llm):
    conversations = ConversationStore(services.redis, services.cipher, 3600, 20)
    return MessageProcessor(services, llm, DirectoryWeCom(), conversations)


def kb_events(services):
    with services.db.session() as session:
        rows = session.scalars(select(AuditEvent).where(AuditEvent.event_type == "admin_change")
                               .order_by(AuditEvent.seq)).all()
        return [services.audit.payload_of(e) for e in rows]


# -- retrieval -------------------------------------------------------------------------------------
def test_bm25_ranks_chinese_and_english_questions(services, loaded):
    retriever = Retriever(services)
    top = retriever.search("第一年有几天年假", []).passages[0]
    assert top.section == "年假 Annual leave" and top.title == "员工手册" and "10 天" in top.text
    top = retriever.search("how many days to submit an expense claim?", []).passages[0]
    assert top.section == "报销 Expenses"
    top = retriever.search("VPN 客户端 client", []).passages[0]
    assert top.section == "VPN" and top.score > 0 and 0 < top.coverage <= 1
    assert not retriever.search("can I bring my dog to the office party?", []).found
    assert not retriever.search("！？。", []).found


def test_a_follow_up_is_searched_with_the_previous_question(services, loaded):
    retriever = Retriever(services)
    assert is_follow_up("那北京呢？") and is_follow_up("and in Beijing?")
    assert not is_follow_up("上海总部在哪里")
    result = retriever.search("那北京呢？", [], previous="上海办公室在哪里")
    assert "上海办公室在哪里" in result.query and result.passages[0].section == "办公室 Offices"
    # a short question finding nothing alone is searched with the previous one, unless it asks
    # about what no document mentions: a new topic, declined (not answered with the old topic's)
    result = retriever.search("Who is our CEO?", [], previous="上海办公室在哪里")
    assert not result.found and result.query == "Who is our CEO?" and result.unknown == ("ceo",)


def test_departments_are_applied_before_ranking(services, loaded):
    retriever = Retriever(services)
    question = "奖金池口令是什么 bonus pool code"
    assert SENTINEL in retriever.search(question, [FINANCE]).passages[0].text
    for departments in ([], [SALES], [SALES, 12]):
        result = retriever.search(question, departments, min_score=0)
        assert all(SENTINEL not in p.text and p.title != "财务制度" for p in result.candidates)
    assert any(SENTINEL in p.text for p in retriever.search(question, EVERYTHING).passages)


# -- the message path ------------------------------------------------------------------------------
def test_a_department_only_passage_never_reaches_another_departments_prompt(app, services, loaded):
    llm = PromptLLM()
    processor = processor_with(services, llm)
    reply = ask(app, services, processor, "bob-sales", "奖金池口令是什么？bonus pool code", 501)
    reply += ask(app, services, processor, "bob-sales", "财务部的奖金池口令", 502)
    assert SENTINEL not in reply
    assert all(SENTINEL not in m["content"] for prompt in llm.prompts for m in prompt)
    reply = ask(app, services, processor, "alice-fin", "奖金池口令是什么？bonus pool code", 503)
    assert any(SENTINEL in llm.prompts[-1][0]["content"] for _ in [0])
    assert reply.startswith("根据资料") and "财务制度 › 奖金池 Bonus pool" in reply
    # user/get's departments are cached in Redis: no lookup for the next question
    lookups = processor.wecom.lookups
    ask(app, services, processor, "alice-fin", "奖金池口令", 504)
    assert processor.wecom.lookups == lookups


def test_the_answer_is_grounded_numbered_and_cites_its_sources(app, services, loaded):
    llm = PromptLLM("第一年有 10 天年假 [1]。")
    processor = processor_with(services, llm)
    reply = ask(app, services, processor, "bob-sales", "我第一年能休几天年假？", 510)
    system = llm.prompts[-1][0]["content"]
    assert "[1] 员工手册 › 年假 Annual leave" in system and "10 天" in system
    assert llm.prompts[-1][-1] == {"role": "user", "content": "我第一年能休几天年假？"}
    assert reply == "第一年有 10 天年假 [1]。\n\n来源 / Sources:\n[1] 员工手册 › 年假 Annual leave"
    # a follow-up: searched with the previous question, which the conversation remembers
    ask(app, services, processor, "bob-sales", "上海总部在哪里", 511)
    ask(app, services, processor, "bob-sales", "那北京呢？", 512)
    assert "66" in llm.prompts[-1][0]["content"]


def test_a_model_not_trained_on_passages_gets_the_question_alone_with_sources_kept(app, services, loaded):
    """KB_PASSAGES_IN_PROMPT=false (make run's bundled demo model, trained on questions, not on
    passages): the prompt is the plain conversation, and the reply still cites what was found."""
    services.settings.kb_passages_in_prompt = False
    services.settings.kb_min_score = 0.3  # only the leave passage: it is the one cited below
    llm = PromptLLM("第一年有 10 天年假。")
    reply = ask(app, services, processor_with(services, llm), "bob-sales", "我第一年能休几天年假？", 520)
    assert llm.prompts[-1][0] == {"role": "system", "content": services.settings.system_prompt}
    assert all("员工手册" not in m["content"] for m in llm.prompts[-1])
    assert reply == "第一年有 10 天年假。\n\n来源 / Sources:\n[1] 员工手册 › 年假 Annual leave"


def test_an_extractive_model_may_only_quote_a_passage_or_decline(app, services, loaded, monkeypatch):
    """KB_ANSWER_BY_QUOTING (make run's, for the demo model): the model is given its possible
    replies, each passage of its prompt quoted whole with its number, or "not found"."""
    from app.knowledge import prompt

    llm = PromptLLM()
    ask(app, services, processor_with(services, llm), "bob-sales", "我第一年能休几天年假？", 520)
    assert llm.params[-1].choice == ()  # by default the model writes freely
    monkeypatch.setattr(services.settings, "kb_answer_by_quoting", True)
    ask(app, services, processor_with(services, llm), "bob-sales", "我第一年能休几天年假？", 521)
    choice, system = llm.params[-1].choice, llm.prompts[-1][0]["content"]
    assert choice[-2:] == (prompt.NOT_FOUND_ZH, prompt.NOT_FOUND_EN) and len(choice) >= 3
    for number, quote in enumerate(choice[:-2], 1):
        text, mark = quote.rsplit(" ", 1)
        assert mark == f"[{number}]" and f"[{number}] 员工手册" in system and text in system
    # scored whole by default; KB_DECLINE_BIAS goes on the two "not found" replies only
    assert llm.params[-1].choice_scoring == "likelihood" and llm.params[-1].choice_bias == ()
    monkeypatch.setattr(services.settings, "kb_decline_bias", 0.8)
    ask(app, services, processor_with(services, llm), "bob-sales", "我第一年能休几天年假？", 522)
    assert llm.params[-1].choice_bias == (0.0,) * (len(choice) - 2) + (0.8, 0.8)
    monkeypatch.setattr(services.settings, "kb_choice_scoring", "tokens")  # vLLM's guided_choice: no bias
    ask(app, services, processor_with(services, llm), "bob-sales", "我第一年能休几天年假？", 523)
    assert llm.params[-1].choice_scoring == "tokens" and llm.params[-1].choice_bias == ()


def test_the_quoted_replies_are_counted_in_the_answers_usage(app, services, loaded, monkeypatch):
    """KB_ANSWER_BY_QUOTING: the engine processes every passage offered as a reply, so the
    usage row counts them, not only the prompt the model server reported (100 here)."""
    from app.accounting import estimate_choice_tokens, estimate_prompt_tokens
    from app.models import UsageRecord

    monkeypatch.setattr(services.settings, "kb_answer_by_quoting", True)
    llm = PromptLLM()
    ask(app, services, processor_with(services, llm), "bob-sales", "我第一年能休几天年假？", 530)
    with services.db.session() as session:
        usage = session.scalars(select(UsageRecord).order_by(UsageRecord.id.desc())).first()
    replies = estimate_choice_tokens(llm.params[-1].choice)
    assert replies > 100 and usage.prompt_tokens >= estimate_prompt_tokens(llm.prompts[-1]) + replies


def test_the_ai_bot_stream_ends_with_markdown_sources(services, loaded, monkeypatch):
    from tests.worker.test_reasoning_replies import aibot_row

    monkeypatch.setattr(services.settings, "aibot_refresh_throttle_s", 0.0)
    llm = PromptLLM("第一年 10 天 [1]。")
    message_id = aibot_row(services, "我第一年能休几天年假？", "S-kb")
    assert processor_with(services, llm).process(message_id).status == "done"
    assert services.streams.get("S-kb").text == (
        "第一年 10 天 [1]。\n\n**来源 / Sources**\n> [1] 员工手册 › 年假 Annual leave")


def test_nothing_relevant_declines_without_calling_the_model(app, services, loaded, monkeypatch):
    monkeypatch.setattr(services.settings, "kb_fallback_contact", "HR（分机 8000）")
    llm = PromptLLM()
    processor = processor_with(services, llm)
    reply = ask(app, services, processor, "bob-sales", "can I bring my dog to the office party?", 520)
    assert "没有找到" in reply and "could not find" in reply and "HR（分机 8000）" in reply
    assert llm.prompts == []
    # greetings still go to the model, ungrounded
    ask(app, services, processor, "bob-sales", "你好！", 521)
    assert len(llm.prompts) == 1 and "Passages" not in llm.prompts[0][0]["content"]
    assert is_small_talk("thanks!") and not is_small_talk("thanks, how do I claim expenses?")


def test_the_models_own_not_found_becomes_the_decline_without_sources(app, services, loaded,
                                                                      monkeypatch):
    """Passages were found but do not answer: the model says so in the rules' words, and the
    employee gets the same reply as when nothing was found (the team to ask, no sources)."""
    monkeypatch.setattr(services.settings, "kb_fallback_contact", "HR（分机 8000）")
    for said in ("抱歉，我在知识库里没有找到这个问题的答案。", "Sorry, I could not find this in the knowledge base."):
        llm = PromptLLM(said)
        reply = ask(app, services, processor_with(services, llm), "bob-sales", "我第一年能休几天年假？",
                    540 + len(said))
        assert "Passages" in llm.prompts[-1][0]["content"]  # the model was asked, with passages
        assert reply == not_found_reply("HR（分机 8000）") and "Sources" not in reply


def test_without_documents_the_model_answers_as_before(app, services):
    llm = PromptLLM("普通回答")
    processor = processor_with(services, llm)
    processor.grounder.retriever.search = None  # never searched: calling it would fail
    assert ask(app, services, processor, "bob-sales", "随便问问", 530) == "普通回答"
    assert llm.prompts[0][0]["content"] == services.settings.system_prompt


# -- documents -------------------------------------------------------------------------------------
def counts(services, document_id):
    with services.db.session() as session:
        return (session.scalar(select(func.count()).select_from(KnowledgeChunk)
                               .where(KnowledgeChunk.document_id == document_id)),
                session.scalar(select(func.count()).select_from(KnowledgePosting)
                               .where(KnowledgePosting.document_id == document_id)))


def test_reupload_replaces_atomically_and_delete_removes_with_audit(services, store, loaded,
                                                                     monkeypatch):
    handbook, _ = loaded
    retriever = Retriever(services)
    assert store.add(HANDBOOK.encode(), "员工手册").status == "unchanged"
    changed = HANDBOOK.replace("最多 15 天", "最多 20 天").replace("Xinghe Connect", "NovaLink")
    # a failure while writing the new version leaves the old one whole
    original = KnowledgeStore._write_index

    def broken(self, session, *args):
        original(self, session, *args)
        raise RuntimeError("disk full")

    monkeypatch.setattr(KnowledgeStore, "_write_index", broken)
    with pytest.raises(RuntimeError):
        store.add(changed.encode(), " 员工手册 ")
    monkeypatch.setattr(KnowledgeStore, "_write_index", original)
    assert "Xinghe Connect" in retriever.search("VPN client", []).passages[0].text
    before = counts(services, handbook.document_id)

    result = store.add(changed.encode(), " 员工手册 ")  # same title (normalized): replaced
    assert (result.status, result.document_id) == ("replaced", handbook.document_id)
    assert counts(services, handbook.document_id)[0] == before[0]
    assert "NovaLink" in retriever.search("VPN client", []).passages[0].text
    assert not any("Xinghe Connect" in p.text for p in retriever.search("Xinghe Connect", [],
                                                                         min_score=0).candidates)
    [doc] = [d for d in store.list() if d.id == handbook.document_id]
    assert (doc.title, doc.version, doc.departments) == ("员工手册", 2, [])
    # by id, with a new title and a department scope
    store.add(changed.encode(), "手册 v2", document_id=handbook.document_id, departments=[SALES])
    assert not retriever.search("NovaLink VPN", []).found
    assert retriever.search("NovaLink VPN", [SALES]).found
    with pytest.raises(UploadError, match="no document"):
        store.add(changed.encode(), "x", document_id=999)

    assert store.remove(handbook.document_id) and not store.remove(handbook.document_id)
    assert counts(services, handbook.document_id) == (0, 0)
    assert not retriever.search("NovaLink VPN", [SALES]).found
    actions = [e["action"] for e in kb_events(services)]
    assert actions == ["kb_add", "kb_add", "kb_replace", "kb_replace", "kb_remove"]
    with services.db.reader() as session:
        assert services.audit.verify(session).ok


def test_a_refused_upload_changes_nothing(services, store, loaded):
    before = [(d.id, d.version) for d in store.list()]
    for data, name in [(b"\x89PNG\r\n\x1a\n\x00\x00", "a.pdf"), (b"%PDF-1.4 broken", "b.pdf"),
                       (b"", "c.md")]:
        with pytest.raises(UploadError):
            store.add(data, "员工手册", filename=name)
    assert [(d.id, d.version) for d in store.list()] == before


def test_the_database_holds_no_document_text_title_or_term(services, store, loaded):
    dump = all_text(services.db.engine)
    if services.db.engine.dialect.name == "postgresql":
        import subprocess

        url = services.db.url.replace("postgresql+psycopg", "postgresql")
        dump += subprocess.run(["pg_dump", "--data-only", url], capture_output=True, text=True,
                               check=True, timeout=60).stdout
    assert "kb_" in dump or services.db.engine.dialect.name == "sqlite"
    for plain in (SENTINEL, "财务制度", "员工手册", "Bibo Road", "Xinghe Connect", "奖金池",
                  "handbook.md"):
        assert plain not in dump
    with services.db.session() as session:
        doc = session.scalars(select(KnowledgeDocument)).first()
        assert doc.content_enc.startswith("v1:") and len(doc.title_hash) == 64


# -- CLI -------------------------------------------------------------------------------------------
def test_cli_add_list_search_remove(services, tmp_path, monkeypatch):
    from app import cli

    monkeypatch.setattr(cli, "_services", lambda: services)
    runner = CliRunner()
    path = tmp_path / "handbook.md"
    path.write_text(HANDBOOK, encoding="utf-8")
    out = runner.invoke(cli.cli, ["kb", "add", str(path), "--title", "员工手册"])
    assert out.exit_code == 0 and "added" in out.output, out.output
    out = runner.invoke(cli.cli, ["kb", "add", str(path), "--title", "员工手册"])
    assert "unchanged" in out.output
    secret = tmp_path / "finance.md"
    secret.write_text(FINANCE_ONLY, encoding="utf-8")
    assert runner.invoke(cli.cli, ["kb", "add", str(secret), "--title", "财务制度",
                                   "--departments", "7"]).exit_code == 0
    listing = runner.invoke(cli.cli, ["kb", "list"]).output
    assert "员工手册\tmarkdown" in listing and "departments 7" in listing
    out = runner.invoke(cli.cli, ["kb", "search", "第一年有几天年假"])
    assert out.output.startswith("#1 bm25 ") and "年假 Annual leave" in out.output
    assert SENTINEL not in runner.invoke(cli.cli, ["kb", "search", "bonus pool code"]).output
    assert SENTINEL in runner.invoke(cli.cli, ["kb", "search", "bonus pool code",
                                               "--department", "7"]).output
    for ids in ("9" * 30, "7,x", "0"):  # a clear refusal, never a database error
        out = runner.invoke(cli.cli, ["kb", "add", str(secret), "--title", "x", "--departments", ids])
        assert out.exit_code == 2 and "department id" in out.output, out.output
    out = runner.invoke(cli.cli, ["kb", "search", "bonus", "--department", "9" * 30])
    assert out.exit_code == 2 and "--department" in out.output
    bad = tmp_path / "fake.pdf"
    bad.write_text("not a pdf", encoding="utf-8")
    out = runner.invoke(cli.cli, ["kb", "add", str(bad), "--title", "x"])
    assert out.exit_code == 1 and "named like PDF" in out.output
    doc_id = listing.split("\t", 1)[0]
    assert runner.invoke(cli.cli, ["kb", "reindex"]).output.startswith("2 documents")
    assert runner.invoke(cli.cli, ["kb", "remove", doc_id]).exit_code == 0
    assert runner.invoke(cli.cli, ["kb", "remove", doc_id]).exit_code == 1


# -- schema ----------------------------------------------------------------------------------------
def test_migration_matches_the_models_and_is_reversible(database_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from app import migrate
    from app.db import Base

    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert [d for d in diff if "kb_" in repr(d)] == []
    finally:
        engine.dispose()
    source = (migrate.ROOT / "migrations/versions/0008_knowledge_base.py").read_text(encoding="utf-8")
    down = source.split("down_revision = '", 1)[1].split("'", 1)[0]
    migrate.downgrade(database_url, down)
    engine = sa.create_engine(database_url)
    try:
        assert not [t for t in sa.inspect(engine).get_table_names() if t.startswith("kb_")]
    finally:
        engine.dispose()
    migrate.upgrade(database_url)


# -- dense vectors ---------------------------------------------------------------------------------
CONCEPTS = {"pet": ("pet", "宠物", "dog", "狗", "猫"), "money": ("bonus", "奖金", "口令", "code"),
            "home": ("remote", "居家", "在家", "home")}


def concept_vectors(texts):
    """A stand-in embedding model: one dimension per concept, plus one for everything else."""
    import numpy as np

    out = []
    for text in texts:
        lowered = text.lower()
        v = np.array([sum(lowered.count(w) for w in words) for words in CONCEPTS.values()] + [0.3],
                     dtype=np.float32)
        out.append(v / np.linalg.norm(v))
    return out


def test_dense_vectors_are_sealed_fused_and_scoped(services, monkeypatch):
    from app.knowledge import embeddings

    monkeypatch.setattr(services.settings, "embeddings_base_url", "http://127.0.0.1:9/v1")
    monkeypatch.setattr(services.settings, "kb_min_similarity", 0.9)
    monkeypatch.setattr(embeddings.EmbeddingClient, "embed", lambda self, texts: concept_vectors(texts))
    store = KnowledgeStore(services)
    store.add(b"# Office\n\n## Pets\n\nDogs may come to the office on Fridays.\n", "Office rules")
    store.add(FINANCE_ONLY.encode(), "财务制度", departments=[FINANCE])
    with services.db.session() as session:
        sealed = session.scalars(select(KnowledgeChunk.vector_enc)).all()
    assert sealed and all(v.startswith("v1:") for v in sealed)
    retriever = Retriever(services)
    # no word in common ("猫" is in no document, nor in the glossary): found by its vector alone
    result = retriever.search("可以带猫吗", [])
    assert result.found and result.passages[0].section == "Pets"
    assert result.passages[0].similarity > 0.9 and result.passages[0].coverage < 0.25
    # the finance passage's vector matches "奖金" best, but only its department sees it
    assert all(SENTINEL not in p.text for p in retriever.search("奖金", [SALES], min_score=0).candidates)
    assert SENTINEL in retriever.search("奖金", [FINANCE]).passages[0].text
    # the embeddings server failing: BM25 alone answers
    def down(self, texts):
        raise embeddings.EmbeddingError("embeddings server: ConnectionError")

    monkeypatch.setattr(embeddings.EmbeddingClient, "embed", down)
    from prometheus_client import REGISTRY

    def degraded():
        return REGISTRY.get_sample_value("wecom_bot_knowledge_degraded_total", {"part": "embeddings"}) or 0

    before = degraded()
    assert Retriever(services).search("Dogs office Fridays", []).passages[0].section == "Pets"
    assert degraded() == before + 1  # and the metric says so
    with pytest.raises(UploadError, match="embeddings server"):
        store.add(b"# New\n\ntext here\n", "New doc")


def test_a_passage_only_the_vectors_find_is_not_cut_by_the_fused_rank(services, monkeypatch):
    """Fused by rank, a passage BM25 ranks first and the vectors second outranks one only the
    vectors find; when that one alone is relevant (its cosine over KB_MIN_SIMILARITY), it comes
    first, not after top_k has cut it."""
    from app.knowledge import embeddings

    monkeypatch.setattr(services.settings, "embeddings_base_url", "http://127.0.0.1:9/v1")
    monkeypatch.setattr(services.settings, "kb_min_similarity", 0.9)
    monkeypatch.setattr(embeddings.EmbeddingClient, "embed", lambda self, texts: concept_vectors(texts))
    store = KnowledgeStore(services)
    store.add(b"# Office\n\n## Pets\n\nDogs may come to the office on Fridays.\n", "Office rules")
    store.add(b"# Canteen\n\n## Hours\n\nCanteen hours: lunch 11:30 to 13:30.\n", "Canteen")
    question = "canteen hours for my \u732b"  # "猫" is in no document: the vectors' pet
    retriever = Retriever(services)
    both = retriever.search(question, [], top_k=2, min_score=0.95)
    assert [p.section for p in both.passages] == ["Pets"]  # the relevant one: its cosine
    assert [p.section for p in both.candidates] == ["Pets", "Hours"]
    assert both.candidates[1].coverage > 0 and both.candidates[1].score > both.candidates[0].score
    first = retriever.search(question, [], top_k=1, min_score=0.95)
    assert first.found and first.passages[0].section == "Pets" and first.passages[0].similarity > 0.9


def test_a_new_blind_index_key_keeps_documents_found_until_reindexed(services, env, store, loaded):
    import secrets

    from app.services import Services
    from tests.support.env import settings_from

    old = env["BLIND_INDEX_KEY"]
    new = secrets.token_urlsafe(48)
    ring = Services(settings_from(env, blind_index_key=f"{new},{old}"), services.db)
    assert Retriever(ring).search("第一年有几天年假", []).passages[0].section == "年假 Annual leave"
    # found by its title under the old key, and indexed again under the new one
    again = KnowledgeStore(ring).add(HANDBOOK.encode(), "员工手册")
    assert (again.status, again.document_id) == ("replaced", loaded[0].document_id)
    assert KnowledgeStore(ring).reindex() == 2
    only_new = Services(settings_from(env, blind_index_key=new), services.db)
    assert Retriever(only_new).search("第一年有几天年假", []).passages[0].section == "年假 Annual leave"
    assert not Retriever(services).search("第一年有几天年假", []).found  # the old key alone: gone


def test_the_issues_own_questions_on_the_demo_handbook(services, store):
    from demo.corpus import COMPANY_PATH

    store.add(COMPANY_PATH.read_bytes(), "员工手册", filename="company.md")
    retriever = Retriever(services)
    leave = retriever.search("我第一年能休几天假", []).passages[0]
    assert leave.section == "3. HR 人力资源" and "Annual leave 年假" in leave.text
    vpn = retriever.search("VPN 密码忘了怎么办", []).passages[0]
    assert vpn.section == "2. IT" and "Password Reset" in vpn.text
    office = retriever.search("那北京呢？", [], previous="上海总部在哪里").passages[0]
    assert "Zhongguancun" in office.text
    for question in ("明天天气怎么样", "公司股票期权怎么行权"):
        assert not retriever.search(question, []).found, question
    # a weak match ("language") reaches the model, whose rules have it say "not found"
    weak = retriever.search("What programming language should I learn?", [])
    assert weak.passages and all(p.coverage < 0.3 for p in weak.passages)


def test_a_compounds_pieces_are_not_words_of_their_own_in_coverage(services, store):
    """jieba's search mode cuts "办公室" into 办公 / 公室 / 办公室: one word of the question, so a
    passage about the office covers a small share of "办公室可以抽烟吗" (smoking is what is asked),
    not the most of it (what it did when each piece counted: enough to pass as an answer)."""
    store.add("# 办公\n\n办公室在三楼，办公时间九点到六点。\n".encode(), "手册", filename="office.md")
    retriever = Retriever(services)
    [office] = retriever.search("办公室可以抽烟吗", [], min_score=0.0).candidates
    assert office.coverage < 0.3
    assert not retriever.search("办公室可以抽烟吗", [], min_score=0.3).found
    # the word itself, or its pieces where a passage writes them apart, still cover it
    assert retriever.search("办公室", []).passages[0].coverage == 1.0
    store.add("# 场地\n\n办公区和公室……\n".encode(), "场地", filename="place.md")
    [apart] = [p for p in retriever.search("办公室", [], min_score=0.0).candidates if p.title == "场地"]
    assert apart.coverage == 1.0


def test_a_chinese_question_finds_the_english_passage_through_the_glossary(services, store):
    """"出国" and "餐补" are asked; the English handbook says "outside mainland China" and
    "per-diem": ordinary office words, in the glossary both ways."""
    store.add(b"# Travel\n\n- **Meal per-diem**: Tier 1 150 RMB, outside mainland China 300 RMB.\n"
              b"\n# Canteen\n\nBreakfast 07:30-09:30 on 2F.\n", "Handbook", filename="travel.md")
    [top, *_] = Retriever(services).search("出国出差一天的餐补是多少？", [], min_score=0.0).candidates
    assert "per-diem" in top.text and top.coverage > 0.6


def test_a_quoting_model_is_shown_this_questions_passages_not_the_earlier_exchanges(app, services, loaded):
    """KB_ANSWER_BY_QUOTING (the demo model): the earlier exchanges pulled it toward "not found"
    (prompt.shown_history); a follow-up still finds its passages through the previous question.
    A model that writes its answer keeps the conversation."""
    services.settings.kb_answer_by_quoting = True
    llm = PromptLLM("上海总部在张江碧波路 888 号。[1]")
    processor = processor_with(services, llm)
    ask(app, services, processor, "bob-sales", "上海总部在哪里", 560)
    ask(app, services, processor, "bob-sales", "那北京呢？", 561)
    prompt_ = llm.prompts[-1]
    assert [m["role"] for m in prompt_] == ["system", "user"] and prompt_[-1]["content"] == "那北京呢？"
    assert "66" in prompt_[0]["content"]  # the Beijing passage, found with the previous question
    assert any("中关村" in choice for choice in llm.params[-1].choice)
    services.settings.kb_answer_by_quoting = False
    ask(app, services, processor, "bob-sales", "报销要多久内提交？", 562)
    assert [m["content"] for m in llm.prompts[-1] if m["role"] == "user"] == [
        "上海总部在哪里", "那北京呢？", "报销要多久内提交？"]
