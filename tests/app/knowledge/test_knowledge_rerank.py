"""Reranking (RERANK_BASE_URL): a cross-encoder's scores order the fused candidates and alone
decide what is relevant; it never sees a passage the employee may not; when it fails or answers
nonsense, the thresholds decide as without it. Against a small server of ours that speaks the
Jina / Cohere /rerank protocol (tests/support/rerank_server.py), on both databases."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import REGISTRY

from app.knowledge.rerank import RerankClient, RerankError
from app.knowledge.retrieval import Retriever
from app.knowledge.store import KnowledgeStore
from tests.app.knowledge.test_knowledge_base import (  # noqa: F401 - app: a fixture
    FINANCE,
    FINANCE_ONLY,
    SALES,
    SENTINEL,
    PromptLLM,
    app,
    ask,
    processor_with,
)
from tests.support.rerank_server import FakeRerankServer

CANTEEN = """# Canteen 食堂

## Hours

Canteen hours: lunch 11:30 to 13:30, dinner 17:30 to 19:00, on every floor's canteen today.

## Menu

The canteen's lunch menu for the week is posted in WeCom every Monday.

## Parking

Visitors park on level B2; register the plate at reception.
"""
KEY = "rerank-key-" + "r" * 24


def judge_by_topic(query: str, document: str) -> float:
    """The test's cross-encoder: what is on the menu is answered by the menu passage alone."""
    if "menu" in document.lower():
        return 0.92 if "lunch" in query.lower() or "吃什么" in query else 0.2
    return 0.08


@pytest.fixture
def reranker(services, monkeypatch):
    from pydantic import SecretStr

    server = FakeRerankServer(judge_by_topic, api_key=KEY).start()
    for name, value in {"rerank_base_url": server.url, "rerank_model": "test-reranker",
                        "rerank_api_key": SecretStr(KEY), "kb_min_relevance": 0.5}.items():
        monkeypatch.setattr(services.settings, name, value)
    yield server
    server.stop()


@pytest.fixture
def canteen(services):
    store = KnowledgeStore(services)
    store.add(CANTEEN.encode(), "Canteen rules")
    store.add(FINANCE_ONLY.encode(), "财务制度", departments=[FINANCE])


def test_the_rerankers_scores_order_the_passages_and_decide_relevance(services, canteen, reranker):
    question = "what is for lunch today in the canteen"
    result = Retriever(services).search(question, [], top_k=3)
    assert reranker.calls == 1 and reranker.problems == []
    # BM25 puts the hours first (lunch, today, canteen); the cross-encoder reads the menu as the answer
    assert result.candidates[0].section == "Menu" and result.candidates[1].section == "Hours"
    assert result.candidates[1].score > result.candidates[0].score
    assert [p.section for p in result.passages] == ["Menu"]
    assert result.passages[0].relevance == pytest.approx(0.92)
    assert [p.relevance for p in result.candidates] == sorted((p.relevance for p in result.candidates),
                                                              reverse=True)
    hours = next(p for p in result.candidates if p.section == "Hours")
    assert hours.relevance < 0.5 and hours.coverage > 0 and hours not in result.passages
    body = reranker.bodies[-1]
    assert body["model"] == "test-reranker" and body["query"] == question
    assert body["top_n"] == len(body["documents"]) <= services.settings.rerank_candidates
    assert any(d.startswith("Menu\n") for d in body["documents"])  # section path and text


def test_a_near_topic_question_is_declined_though_its_words_match(services, canteen, reranker,
                                                                 monkeypatch):
    question = "canteen dinner hours on the B2 parking level"  # every word is in the documents
    monkeypatch.setattr(services.settings, "rerank_base_url", "")
    assert Retriever(services).search(question, []).found  # the thresholds let it through
    monkeypatch.setattr(services.settings, "rerank_base_url", reranker.url)
    result = Retriever(services).search(question, [])
    assert not result.found and result.candidates
    assert all(p.relevance < services.settings.kb_min_relevance for p in result.candidates)


def test_the_reranker_never_sees_another_departments_passage(services, canteen, reranker):
    for question, departments in (("奖金池口令 canteen lunch", [SALES]), ("bonus pool code, canteen hours", []),
                                  ("the bonus pool code", [SALES])):
        Retriever(services).search(question, departments)
    assert len(reranker.bodies) == 2  # the third matches nothing the employee may see: not called
    assert all(SENTINEL not in d for b in reranker.bodies for d in b["documents"])
    Retriever(services).search("奖金池口令是什么", [FINANCE])  # a member of finance: it may
    assert any(SENTINEL in d for d in reranker.bodies[-1]["documents"])


def degraded(part: str) -> float:
    return REGISTRY.get_sample_value("wecom_bot_knowledge_degraded_total", {"part": part}) or 0.0


def test_a_failing_reranker_leaves_the_thresholds_to_decide(services, canteen, reranker, caplog, monkeypatch):
    monkeypatch.setattr(services.settings, "kb_server_retry_s", 0.0)  # tried again every question
    question = "canteen lunch hours"
    before = degraded("rerank")
    Retriever(services).search(question, [])
    assert degraded("rerank") == before  # it answered: nothing to count
    reranker.fail_next = 1
    with caplog.at_level(logging.WARNING, logger="app.knowledge.retrieval"):
        result = Retriever(services).search(question, [])
    assert result.found and result.passages[0].section == "Hours"
    assert all(p.relevance is None for p in result.candidates)
    assert "reranking skipped: rerank server: HTTPError" in caplog.text
    for broken in ({"results": [{"index": 99, "relevance_score": 0.9}]},  # out of range
                   {"results": [{"index": 0, "relevance_score": 0.9}]},  # one of several scored
                   {"results": [{"index": 0}]}, {"data": []}, "not a list"):
        reranker.answer = lambda body, broken=broken: broken
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="app.knowledge.retrieval"):
            result = Retriever(services).search(question, [])
        assert result.found and result.passages[0].relevance is None, broken
        assert "reranking skipped" in caplog.text
    reranker.answer = None
    stopped = reranker.url
    reranker.stop()
    result = Retriever(services).search(question, [])  # nobody listening: the same
    assert result.found and stopped
    assert degraded("rerank") == before + 7  # each time it failed, the metric says so


def test_the_worker_puts_the_rerankers_best_passage_first_in_the_prompt(app, services, canteen,  # noqa: F811
                                                                        reranker):
    searches = {o: REGISTRY.get_sample_value("wecom_bot_knowledge_searches_total", {"outcome": o}) or 0.0
                for o in ("found", "not_found")}
    llm = PromptLLM()
    reply = ask(app, services, processor_with(services, llm), "bob-sales", "今天中午吃什么 lunch", "rr-1")
    system = llm.prompts[-1][0]["content"]
    assert "[1] Canteen rules › Menu" in system and "Hours" not in system
    assert "Canteen rules › Menu" in reply
    assert REGISTRY.get_sample_value("wecom_bot_knowledge_searches_total", {"outcome": "found"}) == \
        searches["found"] + 1
    ask(app, services, processor_with(services, llm), "bob-sales", "canteen dinner hours on level B2", "rr-2")
    assert REGISTRY.get_sample_value("wecom_bot_knowledge_searches_total", {"outcome": "not_found"}) == \
        searches["not_found"] + 1


def test_the_client_reads_the_tei_answer_and_refuses_a_wrong_one():
    server = FakeRerankServer(judge_by_topic, tei=True).start()
    try:
        client = RerankClient(server.url, "test-reranker")
        assert client.scores("lunch", ["Hours", "Menu of the week", "Parking"]) == \
            pytest.approx([0.08, 0.92, 0.08])
        assert client.scores("lunch", []) == [] and server.calls == 1
        for broken in ([{"index": 0, "score": 0.5}, {"index": 0, "score": 0.4}],  # repeated
                       [{"index": True, "score": 0.5}, {"index": 1, "score": 0.4}],
                       [{"index": 0, "score": float("nan")}, {"index": 1, "score": 0.4}],
                       [{"index": 0, "score": "high"}, {"index": 1, "score": 0.4}]):
            server.answer = lambda body, broken=broken: broken
            with pytest.raises(RerankError, match="rerank server"):
                client.scores("lunch", ["a", "b"])
        server.answer = None
        wrong = RerankClient(server.url, "another-model")
        with pytest.raises(RerankError, match="HTTPError"):
            wrong.scores("lunch", ["a"])
        assert server.problems == ["model 'another-model' is not 'test-reranker'"]
    finally:
        server.stop()


def test_kb_search_prints_the_rerankers_score_and_what_decided(services, canteen, reranker, monkeypatch):
    from click.testing import CliRunner

    from app import cli

    monkeypatch.setattr(cli, "_services", lambda: services)
    out = CliRunner().invoke(cli.cli, ["kb", "search", "what is for lunch today in the canteen"]).output
    assert out.startswith("#1 bm25 ") and "relevance 0.92  [" in out and "(not relevant)" in out
    out = CliRunner().invoke(cli.cli, ["kb", "search", "canteen dinner hours on the B2 parking level"]).output
    assert "no passage reaches KB_MIN_RELEVANCE 0.5 (the reranker's score)" in out


def test_a_server_that_hangs_is_left_alone_for_a_while(services, canteen, reranker, monkeypatch):
    """A reranker that does not answer costs one question its timeout, not every question's."""
    import time

    monkeypatch.setattr(services.settings, "rerank_timeout_s", 0.3)
    monkeypatch.setattr(services.settings, "kb_server_retry_s", 1.0)
    reranker.delay_s = 1.0
    question = "what is for lunch today in the canteen"
    started = time.monotonic()
    first = Retriever(services).search(question, [])
    assert time.monotonic() - started >= 0.3 and first.passages[0].relevance is None
    calls = reranker.calls
    started = time.monotonic()
    for _ in range(3):  # other questions, other Retrievers of the same process: straight on
        assert Retriever(services).search(question, []).passages[0].relevance is None
    assert reranker.calls == calls and time.monotonic() - started < 0.3
    reranker.delay_s = 0.0
    time.sleep(1.1)
    assert Retriever(services).search(question, []).passages[0].relevance == pytest.approx(0.92)
    assert Retriever(services).search(question, []).passages[0].relevance == pytest.approx(0.92)
    assert reranker.calls == calls + 2  # tried again after KB_SERVER_RETRY_S, and closed again


def test_the_breaker_lets_one_trial_through_after_the_wait():
    from app.knowledge.breaker import Breaker

    now = [100.0]
    breaker = Breaker(clock=lambda: now[0])
    assert breaker.allows("rerank x", 30)
    breaker.failed("rerank x", 30)
    assert not breaker.allows("rerank x", 30) and breaker.allows("embeddings x", 30)
    now[0] += 30
    assert breaker.allows("rerank x", 30)  # the trial
    assert not breaker.allows("rerank x", 30)  # the others wait while it runs
    breaker.succeeded("rerank x")
    assert breaker.allows("rerank x", 30) and breaker.allows("rerank x", 30)
