"""KB_JUDGE_EACH_PASSAGE's loop (`app/knowledge/judging.py`): passage by passage, best first,
until the model does not decline; the citation renumbered; every call's tokens counted."""

import pytest

from app.knowledge import judging, prompt
from app.knowledge.retrieval import Passage
from app.llm import Generation, GenerationParams


def passage(n: int) -> Passage:
    return Passage(chunk_id=n, document_id=1, title="手册", section=f"§{n}", text=f"第 {n} 条", score=1.0,
                   coverage=1.0)


class Scripted:
    def __init__(self, *replies: str):
        self.replies, self.asked = list(replies), []

    def __call__(self, messages, params):
        self.asked.append((messages, params))
        return Generation(text=self.replies.pop(0), model="m", prompt_tokens=50, completion_tokens=5,
                          cached_tokens=10, latency_s=0.5)


def run(generate, passages):
    return judging.answer_each(generate, lambda ps: [{"role": "system", "content": "|".join(p.text for p in ps)}],
                               passages, lambda ps: GenerationParams(choice=tuple(p.text for p in ps)))


def test_the_first_passage_not_declined_answers_with_its_own_number():
    generate = Scripted(prompt.NOT_FOUND_ZH, "第 2 条 [1]，另见 [3]", "unused")
    out = run(generate, [passage(1), passage(2), passage(3)])
    assert out.text == "第 2 条 [2]，另见 [3]"  # only its own [1] is renumbered
    assert [m[0]["content"] for m, _ in generate.asked] == ["第 1 条", "第 2 条"]
    assert [p.choice for _, p in generate.asked] == [("第 1 条",), ("第 2 条",)]
    assert (out.prompt_tokens, out.completion_tokens, out.cached_tokens, out.latency_s) == (100, 10, 20, 1.0)


def test_declining_every_passage_is_the_models_not_found():
    generate = Scripted(prompt.NOT_FOUND_EN, "", prompt.NOT_FOUND_ZH)  # an empty reply is no answer
    out = run(generate, [passage(1), passage(2), passage(3)])
    assert prompt.is_decline(out.text) and out.prompt_tokens == 150 and len(generate.asked) == 3


def test_no_passages_is_a_caller_error():
    with pytest.raises(ValueError):
        run(Scripted(), [])
