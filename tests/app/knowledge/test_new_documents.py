"""A document an admin adds, which the demo's embedder never saw, is found by the worker's
retrieval with ``make run``'s reading (dense retrieval on, its thresholds), in English and
Chinese, and only by those who may see it.

The embedder was trained on the handbook: on a new document its cosine is low (0.2-0.5), under
``KB_MIN_SIMILARITY``. Dense similarity ranks but must not be the only way in: a passage the
question's words cover is relevant whatever the cosine (``app.knowledge.retrieval``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.knowledge.audience import Audience
from app.knowledge.evaluate import scratch_knowledge_base
from app.knowledge.store import KnowledgeStore
from demo.corpus import HANDBOOKS
from demo.grounded import DEMO_EMBEDDER, demo_reading
from worker.knowledge import Grounder

ROOT = Path(__file__).resolve().parents[3]
DOCUMENTS = ROOT / "tests" / "fixtures" / "new_documents"
FINANCE = 7
pytestmark = pytest.mark.skipif(not (ROOT / DEMO_EMBEDDER).is_dir(), reason="the demo embedder is not built")

FOR_EVERYONE = [  # (question, a fact the passage must hold)
    ("上海团队哪天搬到临港大厦？", "2027 年 3 月 15 日"),
    ("How often does the shuttle bus from Dishui Lake run?", "20 minutes"),
    ("班车多久一班？", "20 分钟"),
    ("How much is the locker key deposit?", "RMB 50"),
    ("储物柜钥匙押金多少钱？", "50 元"),
    ("By when must I pack my desk into the blue crates?", "12 March"),
]
FOR_FINANCE = [
    ("What is the approval code for large wire transfers?", "TRX-7731"),
    ("大额电汇的审批代码是什么？", "TRX-7731"),
    ("When are journal entries frozen at quarter end?", "18:00"),
    ("季度结账凭证什么时候冻结？", "18:00"),
]


@pytest.fixture(scope="module")
def grounder():
    with scratch_knowledge_base(HANDBOOKS, embeddings=str(ROOT / DEMO_EMBEDDER),
                                **demo_reading(dense=True)) as services:
        store = KnowledgeStore(services)
        store.add((DOCUMENTS / "everyone.md").read_bytes(), "Office move 2027", filename="everyone.md")
        store.add((DOCUMENTS / "finance.md").read_bytes(), "Finance team notes", filename="finance.md",
                  departments=[FINANCE])
        assert services.settings.embeddings_base_url  # dense retrieval is on, as in make run
        yield Grounder(services, wecom=None, directory=None)


def _found(grounder, question: str, departments: list[int]):
    grounding = grounder.ground("hash", "user", question, [], audience=Audience.member(departments))
    assert grounding is not None
    return grounding.passages


@pytest.mark.parametrize(("question", "fact"), FOR_EVERYONE)
def test_a_document_for_everyone_is_found_by_anyone(grounder, question, fact):
    passages = _found(grounder, question, [])
    assert any(p.title == "Office move 2027" and fact in p.text for p in passages), \
        [(p.title, p.coverage, p.similarity) for p in passages]


@pytest.mark.parametrize(("question", "fact"), FOR_FINANCE)
def test_a_department_document_is_found_by_its_members_only(grounder, question, fact):
    passages = _found(grounder, question, [FINANCE])
    assert any(p.title == "Finance team notes" and fact in p.text for p in passages), \
        [(p.title, p.coverage, p.similarity) for p in passages]
    assert not any(p.title == "Finance team notes" for p in _found(grounder, question, [FINANCE + 1]))


def test_the_new_document_is_found_beside_a_follow_up_in_a_conversation(grounder):
    history = [{"role": "user", "content": "How much is the locker key deposit?"},
               {"role": "assistant", "content": "RMB 50, refunded when you return the key."}]
    grounding = grounder.ground("hash", "user", "那班车呢？多久一班？", history, audience=Audience.member([]))
    assert any(p.title == "Office move 2027" and "20" in p.text for p in grounding.passages)


@pytest.mark.parametrize(("previous", "question", "fact"), [
    ("公积金公司交多少比例", "那个密码锁定多久？", "15"),  # a topic of its own, opened like a follow-up
    ("How much is the locker key deposit?", "那班车呢？多久一班？", "20"),
    ("上海出差住宿标准多少", "那北京呢？", "600"),  # a real follow-up keeps the previous question
])
def test_a_follow_up_is_answered_on_its_own_topic(grounder, previous, question, fact):
    """Searched with the previous question, "那个密码锁定多久？" found the housing fund's
    passage (the previous question's words) and was answered with it in make run's chat: a
    passage that holds none of the follow-up's own words gives way to what it finds alone."""
    history = [{"role": "user", "content": previous}, {"role": "assistant", "content": "…"}]
    grounding = grounder.ground("hash", "user", question, history, audience=Audience.member([]))
    assert grounding.passages and fact in grounding.passages[0].text, [p.text[:60] for p in grounding.passages]


def test_the_cli_refuses_to_add_a_document_without_the_vectors_the_others_have(grounder, monkeypatch):
    """``kb add`` run without the stack's embeddings settings (var/dev.env alone) would store a
    document dense retrieval never ranks: refused with what to load, unless asked for."""
    from click.testing import CliRunner

    from app import cli
    from app.services import Services

    services = grounder.services
    bare = Services(services.settings.model_copy(update={"embeddings_base_url": ""}), services.db)
    monkeypatch.setattr(cli, "_services", lambda: bare)
    path = DOCUMENTS / "everyone.md"
    out = CliRunner().invoke(cli.cli, ["kb", "add", str(path), "--title", "Office move (copy)"])
    assert out.exit_code != 0 and "EMBEDDINGS_BASE_URL" in out.output and "var/stack.env" in out.output
    assert "Office move (copy)" not in CliRunner().invoke(cli.cli, ["kb", "list"]).output
    # with the stack's settings it is stored with vectors
    monkeypatch.setattr(cli, "_services", lambda: services)
    out = CliRunner().invoke(cli.cli, ["kb", "add", str(path), "--title", "Office move (copy)"])
    assert out.exit_code == 0, out.output
    monkeypatch.setattr(cli, "_services", lambda: bare)
    out = CliRunner().invoke(cli.cli, ["kb", "add", str(path), "--title", "Office move (bare)",
                                       "--without-vectors"])
    assert out.exit_code == 0, out.output
