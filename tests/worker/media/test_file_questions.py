"""Files first (worker/media/file_questions.py): which questions are about the conversation's
file, and, through the real processor against the stand-in model server, a question about a file
is answered from it (cited by its name), never with the knowledge base's decline; file and
passages together when both are relevant; a quoting model (the demo's KB_ANSWER_BY_QUOTING) is
offered the file's chunks to quote, without "not found"."""

from __future__ import annotations

import pytest

from app.knowledge import prompt
from app.knowledge.store import KnowledgeStore
from app.llm import OpenAIBackend
from app.web.factory import create_app
from tests.app.knowledge.test_knowledge_base import HANDBOOK, ask, processor_with
from tests.support.openai_server import FakeOpenAIServer
from worker.media.file_questions import consider, kb_question, refers_to_file

POLICY = {"name": "policy.pdf", "ref": 1, "text": (  # as worker/media/handler.py keeps a PDF: pages
    "# p. 1\n\nEmulator travel policy: what a business trip may cost and how it is claimed, "
    "for every employee of the company, from the first day of the trip.\n\n"
    "# p. 2\n\nHotels in Beijing: up to 600 RMB per night, booked through the travel desk "
    "or the company's own booking channel in the WeCom workbench.\n\n"
    "# p. 3\n\nTaxis after 22:00 are reimbursed with the trip's receipt and the reason for the "
    "late ride written in the claim's remarks.")}
FILES = [POLICY]


@pytest.mark.parametrize("question", [
    "这个文件讲了什么？", "这份文档的主要内容是什么", "帮我总结一下", "上面的PDF里北京住宿多少钱？",
    "文件里说出租车怎么报销？", "我发的文件有几页", "policy.pdf 里有什么", "policy 讲的是什么",
    "What is this file about?", "Summarize the attached document", "In the document, what is the hotel cap?",
    "tl;dr", "what does the pdf say about taxis?"])
def test_questions_that_refer_to_the_file(question):
    assert refers_to_file(question, FILES)


@pytest.mark.parametrize("question", [
    "报销需要什么文件？", "年假有几天？", "VPN 怎么连？", "出差去杭州住酒店一晚最多能报多少？",
    "帮我写一首关于春天的诗", "Python 里怎么反转列表", "Which form do I fill in for expenses?"])
def test_questions_that_do_not(question):
    assert not refers_to_file(question, FILES)
    assert not refers_to_file("这个文件讲了什么？", [])  # no file, no reference


def test_the_knowledge_base_is_searched_without_the_reference():
    assert kb_question("这个文件讲了什么？", FILES) == "讲了什么？"
    assert kb_question("policy.pdf 里北京住宿多少钱", FILES) == "北京住宿多少钱"
    assert kb_question("这份文档里说北京住宿多少钱", FILES) == "说北京住宿多少钱"
    assert kb_question("年假有几天？", FILES) == "年假有几天？"


def test_relevance_and_the_empty_knowledge_base_decide_too(settings):
    taxi = consider("出租车 taxis after 22:00 reimbursed?", FILES, kb_found=True, settings=settings)
    assert taxi.about and not taxi.refers  # relevant by coverage
    assert not consider("年假有几天？", FILES, kb_found=True, settings=settings).about
    assert consider("年假有几天？", FILES, kb_found=False, settings=settings).about  # nothing else


# -- through the processor -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    server = FakeOpenAIServer().start()
    yield server
    server.stop()


@pytest.fixture
def processor(services, model):
    model.bodies.clear()
    model.scripted.clear()
    KnowledgeStore(services).add(HANDBOOK.encode(), "员工手册", filename="handbook.md")
    llm = OpenAIBackend(model.url, "fake-glm", timeout_s=10, retries=0, reply_start="answer")
    return processor_with(services, llm)


@pytest.fixture
def app(services):
    return create_app(services=services)


def with_file(services, processor, user="bob-sales"):
    key = services.blind_index("wecom-user", user)
    processor.files.add(key, 1, POLICY["name"], POLICY["text"])


def system_of(body) -> str:
    return "\n".join(m["content"] for m in body["messages"] if m["role"] == "system")


def test_a_question_about_the_file_is_answered_from_it(app, services, processor, model):
    assert ask(app, services, processor, "bob-sales", "这个文件讲了什么？", 701).startswith("抱歉")  # no file yet
    with_file(services, processor)
    reply = ask(app, services, processor, "bob-sales", "这个文件讲了什么？", 702)
    system = system_of(model.bodies[-1])
    assert "[1] policy.pdf" in system and "600 RMB" in system
    assert "没有找到" not in reply and reply.endswith("[1] policy.pdf")


def test_file_and_passages_together_and_the_models_decline_names_the_file(app, services, processor,
                                                                          model):
    with_file(services, processor)
    ask(app, services, processor, "bob-sales", "这个文件和手册里的年假规定一样吗？", 711)
    system = system_of(model.bodies[-1])
    assert "[1] policy.pdf" in system and "员工手册 › 年假 Annual leave" in system
    model.scripted["出租车"] = prompt.NOT_FOUND_ZH
    reply = ask(app, services, processor, "bob-sales", "文件里出租车能报销吗", 712)
    assert "《policy.pdf》" in reply and reply != prompt.not_found_reply(prompt.contact_of(services.settings))


def test_a_quoting_model_is_offered_the_files_chunks_without_not_found(app, services, processor, model,
                                                                       monkeypatch):
    monkeypatch.setattr(services.settings, "kb_answer_by_quoting", True)
    monkeypatch.setattr(services.settings, "kb_chunk_tokens", 40)
    with_file(services, processor)
    reply = ask(app, services, processor, "bob-sales", "这个文件讲了什么？", 721)
    choices = model.bodies[-1]["guided_choice"]
    assert prompt.NOT_FOUND_ZH not in choices and prompt.NOT_FOUND_EN not in choices
    assert choices[0].startswith("Emulator travel policy")  # nothing scores: its beginning first
    assert "来源 / Sources:\n[3] policy.pdf › p. 3" in reply  # the stand-in quotes the last choice
    # a question the file answers, by the same scoring as the knowledge base: that chunk first
    # among the file's (after the knowledge base's own passages: the question names no file)
    ask(app, services, processor, "bob-sales", "taxis after 22:00 reimbursed?", 722)
    firsts = [c.split(" ")[0] for c in model.bodies[-1]["guided_choice"]]
    assert firsts.index("Taxis") < firsts.index("Emulator")
