"""The demo model's reading lessons (`demo.reading`): made-up documents whose facts change with
every draw, a question about one fact, and the reply the product's sentence quoting can give."""

import random
import re

from app.knowledge import prompt
from demo import eval_sets
from demo.reading import document, lesson

LESSONS = [lesson(random.Random(seed), seed) for seed in range(300)]


def test_an_answer_is_a_sentence_the_engine_may_quote_from_the_passage_it_names():
    answers = 0
    for question, passages, reply in LESSONS:
        if prompt.is_decline(reply):
            continue
        answers += 1
        assert reply in prompt.quote_choices(passages, "sentence")
        number = int(re.search(r"\[(\d)\]$", reply).group(1))
        assert reply.rsplit(" [", 1)[0] in prompt.sentences(passages[number - 1].text)
    assert 0.6 < answers / len(LESSONS) < 0.8  # about 30 % decline


def test_a_decline_is_shown_passages_without_the_fact():
    for serial in range(200):
        doc = document(random.Random(serial), serial)  # the document the lesson draws first
        question, passages, reply = lesson(random.Random(serial), serial)
        if not prompt.is_decline(reply):
            continue
        # the fact asked about is the one whose question this is; none of its sentences is shown
        asked = [sentence for fact, _, sentence in doc.located
                 if question in {fact.question(lang, random.Random(s)) for lang in ("en", "zh") for s in range(50)}]
        shown = {s for p in passages for s in prompt.sentences(p.text)}
        assert passages and asked and not set(asked) <= shown
        assert reply == (prompt.NOT_FOUND_ZH if re.search(r"[\u4e00-\u9fff]", question) else prompt.NOT_FOUND_EN)


def test_the_facts_change_with_every_document_so_only_reading_answers():
    replies = [reply for _, _, reply in LESSONS if not prompt.is_decline(reply)]
    numbers = {n for reply in replies for n in re.findall(r"\d{2,}", reply)}
    assert len(numbers) > 40
    texts = [p.text for _, passages, _ in LESSONS for p in passages]
    assert any(t.startswith("|") for t in texts) and any(t.startswith("- ") for t in texts)
    assert any(re.search(r"[\u4e00-\u9fff]", t) for t in texts) and any(t.isascii() for t in texts)
    # several facts of one kind in one document: the subject, not the kind, picks the sentence
    doc = document(random.Random(1), 1)
    leave = [s for fact, _, s in doc.located if fact.section[0] == "Leave"]
    assert len(leave) >= 2 or len([f for f, _, _ in doc.located]) < 20


def test_no_lesson_asks_an_evaluation_question_or_uses_an_evaluation_company():
    asked = {question for question, _, _ in LESSONS}
    assert not asked & eval_sets.questions()
    text = " ".join(p.text + p.title for _, passages, _ in LESSONS for p in passages)
    assert "Lanshan" not in text and "蓝山" not in text and "Xinghe" not in text
