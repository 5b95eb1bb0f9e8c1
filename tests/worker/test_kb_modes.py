"""KB_MODE strict | open through the real processor, against the stand-in OpenAI-compatible
server (tests/support/openai_server.py) on both databases: grounded answers cite their passages
in both modes; nothing found declines (strict, no model call) or is answered generally with the
note and the conversation kept (open); the model's own "not found" over passages the same way;
a passage the asker may not see never reaches the general answer's prompt."""

from __future__ import annotations

import pytest

from app.knowledge import modes, prompt
from app.knowledge.store import KnowledgeStore
from app.llm import OpenAIBackend
from app.web.factory import create_app
from tests.app.knowledge.test_knowledge_base import (
    FINANCE,
    FINANCE_ONLY,
    HANDBOOK,
    SENTINEL,
    ask,
    processor_with,
)
from tests.support.openai_server import FakeOpenAIServer

DOG = "can I bring my dog to the office party?"
LEAVE = "我第一年能休几天年假？"


@pytest.fixture(scope="module")
def model():
    server = FakeOpenAIServer().start()
    yield server
    server.stop()


@pytest.fixture
def llm(model):
    model.bodies.clear()
    model.scripted.clear()
    return OpenAIBackend(model.url, "fake-glm", timeout_s=10, retries=0, reply_start="answer")


@pytest.fixture
def loaded(services):
    """The handbook for everyone, a document only the finance department sees."""
    store = KnowledgeStore(services)
    store.add(HANDBOOK.encode(), "员工手册", filename="handbook.md")
    store.add(FINANCE_ONLY.encode(), "财务制度", filename="finance.md", departments=[FINANCE])


@pytest.fixture
def app(services):
    return create_app(services=services)


def systems(body) -> str:
    return "\n".join(m["content"] for m in body["messages"] if m["role"] == "system")


def test_strict_is_unchanged(app, services, loaded, model, llm):
    assert services.settings.kb_mode == "strict"
    processor = processor_with(services, llm)
    reply = ask(app, services, processor, "bob-sales", DOG, 601)
    assert "没有找到" in reply and "could not find" in reply and modes.GENERAL_NOTE not in reply
    assert not model.bodies  # declined without the model
    reply = ask(app, services, processor, "bob-sales", LEAVE, 602)
    assert "Passages" in systems(model.bodies[-1]) and "来源 / Sources:" in reply
    assert modes.GENERAL_NOTE not in reply


def test_open_answers_generally_with_the_note_and_the_conversation(app, services, loaded, model,
                                                                   llm, monkeypatch):
    monkeypatch.setattr(services.settings, "kb_mode", "open")
    processor = processor_with(services, llm)
    first = ask(app, services, processor, "bob-sales", LEAVE, 611)  # grounded, as in strict
    assert "来源 / Sources:" in first and modes.GENERAL_NOTE not in first
    reply = ask(app, services, processor, "bob-sales", DOG, 612)
    body = model.bodies[-1]
    assert systems(body) == services.settings.system_prompt  # no passage, no rules
    assert [m["content"] for m in body["messages"] if m["role"] == "user"] == [LEAVE, DOG]
    assert reply.startswith(f"答复#2: {DOG}") and reply.endswith(modes.GENERAL_NOTE)
    assert "没有找到" not in reply and "Sources" not in reply


def test_open_answers_generally_when_the_model_says_the_passages_do_not_answer(
        app, services, loaded, model, llm, monkeypatch):
    model.scripted["年假"] = prompt.NOT_FOUND_ZH
    processor = processor_with(services, llm)
    assert ask(app, services, processor, "bob-sales", LEAVE, 621).startswith(prompt.NOT_FOUND_ZH[:-1])
    assert len(model.bodies) == 1  # strict: the model's decline is the employee's
    monkeypatch.setattr(services.settings, "kb_mode", "open")
    model.bodies.clear()
    reply = ask(app, services, processor, "bob-sales", LEAVE, 622)
    assert [("Passages" in systems(b)) for b in model.bodies] == [True, False]  # asked again, without
    assert reply.endswith(modes.GENERAL_NOTE) and "没有找到" not in reply and "Sources" not in reply


def test_open_never_puts_a_passage_the_asker_may_not_see_in_the_general_prompt(
        app, services, loaded, model, llm, monkeypatch):
    monkeypatch.setattr(services.settings, "kb_mode", "open")
    processor = processor_with(services, llm)
    reply = ask(app, services, processor, "bob-sales", "奖金池口令是什么？bonus pool code", 631)
    assert reply.endswith(modes.GENERAL_NOTE) and SENTINEL not in reply
    assert all(SENTINEL not in str(m["content"]) for b in model.bodies for m in b["messages"])
