"""app/llm/__init__.py's OpenAI backend with a reasoning model: the answer and the think part come back
apart whether the server sends the thinking inline or as ``reasoning_content``."""

from __future__ import annotations

import pytest

from app.llm import GenerationParams, OpenAIBackend
from tests.support.openai_server import (
    REASONING_MODES,
    THINKING,
    FakeOpenAIServer,
    reply_for,
    written,
)

QUESTION = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "年假有几天？"}]
ANSWER = reply_for(QUESTION)
# Which reply starts each server behaviour is read right with (``auto`` reads all of them).
READS = {"inline": ("auto", "answer"), "separate": ("auto", "answer", "thinking"),
         "prefilled": ("auto", "thinking"), "cutoff": ("auto", "answer")}


@pytest.fixture(scope="module")
def server():
    fake = FakeOpenAIServer().start()
    yield fake
    fake.stop()


@pytest.fixture
def model(server):
    server.reasoning = None
    return server


def backend(server, start="auto") -> OpenAIBackend:
    return OpenAIBackend(server.url, "fake-glm", timeout_s=10, retries=0, reply_start=start)


def streamed(llm, params=GenerationParams()):
    deltas = list(llm.stream(QUESTION, params))
    final = deltas[-1].final
    assert final is not None and all(d.final is None for d in deltas[:-1])
    return deltas[:-1], final


def expected_answer(mode):
    return "" if mode == "cutoff" else ANSWER


@pytest.mark.parametrize("mode, start", [(m, s) for m in REASONING_MODES for s in READS[m]])
def test_generate_returns_the_answer_and_the_thinking_apart(model, mode, start):
    model.reasoning = mode
    generation = backend(model, start).generate(QUESTION, GenerationParams())
    assert generation.text == expected_answer(mode)
    assert generation.reasoning == THINKING
    assert generation.finish_reason == ("length" if mode == "cutoff" else "stop")
    reasoning, content, _ = written(ANSWER, mode)
    assert generation.completion_tokens == len(reasoning + content)  # the server's count, as sent
    assert generation.completion_tokens >= len(THINKING) + len(generation.text)  # thinking is paid


@pytest.mark.parametrize("mode, start", [(m, s) for m in REASONING_MODES for s in READS[m]])
def test_a_stream_never_gives_thinking_as_answer(model, mode, start):
    model.reasoning = mode
    deltas, final = streamed(backend(model, start))
    assert "".join(d.text for d in deltas) == final.text == expected_answer(mode)
    assert "".join(d.reasoning for d in deltas) == final.reasoning == THINKING
    assert all("THINKING" not in d.text and "think>" not in d.text for d in deltas)
    assert final.completion_tokens > len(THINKING)


def test_a_plain_model_is_unchanged(model):
    for start in ("auto", "answer"):
        generation = backend(model, start).generate(QUESTION, GenerationParams())
        assert (generation.text, generation.reasoning) == (ANSWER, "")
    deltas, final = streamed(backend(model, "answer"))
    assert [d.text for d in deltas] == [ANSWER[: len(ANSWER) // 2], ANSWER[len(ANSWER) // 2:]]
    assert final.text == ANSWER and final.reasoning == ""


def test_told_that_replies_start_thinking_a_plain_answer_stays_hidden(model):
    # The safe way to be wrong: nothing reaches the answer that could have been thinking.
    generation = backend(model, "thinking").generate(QUESTION, GenerationParams())
    assert generation.text == "" and generation.reasoning == ANSWER


def test_auto_holds_an_answer_until_it_is_known(model):
    deltas, final = streamed(backend(model, "auto"))
    assert [d.text for d in deltas] == [ANSWER]  # released at the end, whole
    assert final.text == ANSWER


def test_the_answer_streams_once_the_thinking_has_ended(model):
    model.reasoning = "prefilled"
    deltas, _ = streamed(backend(model, "auto"))
    answering = [d.text for d in deltas if d.text]
    assert len(answering) > 1  # after </think> the answer streams piece by piece
    assert all(not d.text for d in deltas[: deltas.index(next(d for d in deltas if d.text))])


def test_enable_thinking_is_sent_as_chat_template_kwargs_only_when_asked(model):
    llm = backend(model)
    llm.generate(QUESTION, GenerationParams())
    assert "chat_template_kwargs" not in model.last_body
    llm.generate(QUESTION, GenerationParams(enable_thinking=False))
    assert model.last_body["chat_template_kwargs"] == {"enable_thinking": False}


def test_choices_are_sent_as_guided_choice_only_when_given(model):
    llm = backend(model)
    llm.generate(QUESTION, GenerationParams())
    assert "guided_choice" not in model.last_body
    llm.generate(QUESTION, GenerationParams(choice=("a [1]", "not found")))
    assert model.last_body["guided_choice"] == ["a [1]", "not found"]
    assert "choice_scoring" not in model.last_body and "choice_bias" not in model.last_body  # vLLM's own
    llm.generate(QUESTION, GenerationParams(choice=("a [1]", "not found"), choice_scoring="likelihood",
                                            choice_bias=(0.0, 0.8)))
    assert model.last_body["choice_scoring"] == "likelihood" and model.last_body["choice_bias"] == [0.0, 0.8]


def test_thinking_off_with_a_prefilling_template_reads_the_reply_as_answer(model):
    generation = backend(model, "thinking").generate(QUESTION, GenerationParams(enable_thinking=False))
    assert generation.text == ANSWER and generation.reasoning == ""


def test_vllms_newer_reasoning_field_is_read_too():
    from app import llm as module

    assert module._reasoning_of({"reasoning": "r"}) == "r"
    assert module._reasoning_of({"reasoning_content": "r", "reasoning": None}) == "r"
    assert module._reasoning_of({"reasoning_content": None}) == ""


def test_reply_start_is_checked(model):
    with pytest.raises(ValueError, match="reply_start"):
        backend(model, "sometimes")
