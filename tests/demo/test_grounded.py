"""The demo model's grounded training conversations (`demo.grounded`): built through
the worker's retrieval and prompt, answers marked with a passage that holds them, "not found"
over passages that do not, and no held-out or evaluation question among them."""

import re

import pytest

from app.knowledge import prompt
from app.knowledge.retrieval import Passage
from demo import eval_sets
from demo.corpus import heldout_pairs
from demo.grounded import grounded_samples, holding, pieces, quote
from demo.train import SYSTEM_PROMPT


def passage(section, text):
    return Passage(chunk_id=1, document_id=1, title="手册", section=section, text=text, score=1.0,
                   coverage=1.0)


def test_a_passage_holds_an_answer_by_its_words_within_the_topics_sections():
    it = passage("2. IT", "Passwords: at least **12 characters**; changed every **90 days**.")
    hr = passage("3. HR 人力资源", "Passwords: at least 12 characters; changed every 90 days.")
    answer = "Domain passwords need at least 12 characters and change every 90 days."
    assert holding(answer, [hr, it], "it") == [1]  # the HR passage is outside the IT topic
    assert holding("Printers need a badge to release jobs.", [it], "it") == []  # not this passage
    assert {"12", "90", "passwords", "密码", "码至"} <= pieces("Passwords 12, 90: 密码至少")


@pytest.fixture(scope="module")
def samples():
    return grounded_samples(SYSTEM_PROMPT, seed=7)


def test_answers_cite_a_passage_that_holds_them_and_declines_say_the_rules_words(samples):
    kinds = {s.kind for s in samples}
    assert kinds == {"answer", "decline"}
    for sample in samples:
        system, reply = sample.messages[0]["content"], sample.messages[-1]["content"]
        assert system.startswith(SYSTEM_PROMPT) and "资料 / Passages:" in system
        if sample.kind == "decline":
            assert reply in (prompt.NOT_FOUND_ZH, prompt.NOT_FOUND_EN) and prompt.is_decline(reply)
            continue
        number = int(re.search(r"\[(\d)\]$", reply).group(1))
        assert f"[{number}] " in system  # a passage the prompt really numbers
    declines = sum(s.kind == "decline" for s in samples)
    assert 0.2 < declines / len(samples) < 0.6  # enough negatives, yet mostly answers


def test_no_held_out_or_evaluation_question_is_trained_on(samples):
    asked = {m["content"] for s in samples for m in s.messages if m["role"] == "user"}
    held_out = {q for q, _ in heldout_pairs()}
    evaluation = eval_sets.questions()
    assert asked and not asked & held_out and not asked & evaluation


def test_a_sentence_quote_is_the_sentence_that_holds_the_answer():
    """KB_QUOTE_UNIT=sentence (`demo.train --quote-unit sentence`): the passage's sentence with
    most of the answer's pieces, not the passage."""
    hotels = passage("5. Travel", "- Tier 1 (Beijing): **600 RMB**\n- Tier 2 (Hangzhou): **450 RMB** a night.")
    answer = "In Hangzhou (Tier 2) the hotel limit is 450 RMB a night."
    assert quote(hotels, 2, answer, "sentence") == "Tier 2 (Hangzhou): **450 RMB** a night. [2]"
    assert quote(hotels, 2, answer, "passage") == prompt.quote_reply(hotels, 2)
    assert quote(hotels, 2, answer, "sentence") in prompt.quote_choices([hotels, hotels], "sentence")
