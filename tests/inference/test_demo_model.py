"""The shipped demo checkpoint (`models/demo`): it loads, answers handbook questions, and MTP
speculative greedy decoding gives exactly its plain greedy answers."""

import re
from pathlib import Path

import pytest

from inference.demo.corpus import load_qa
from inference.llm import LLM
from inference.sampling_params import SamplingParams

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"
pytestmark = pytest.mark.skipif(not (DEMO / "model.safetensors").exists(), reason="no models/demo")


@pytest.fixture(scope="module")
def demo():
    return LLM.from_pretrained(DEMO)


def test_demo_checkpoint_is_small_and_complete():
    names = {p.name for p in DEMO.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= names
    assert sum(p.stat().st_size for p in DEMO.iterdir()) <= 25 * 2**20


def test_demo_answers_from_the_passage_that_holds_the_answer():
    """Asked as the worker asks with make run's settings for it (each passage alone when it
    judges one at a time, choosing a quote or "not found"), over the demo handbook in the
    knowledge base: it quotes the passage that answers, with its number, and says "not found"
    in the rules' words over passages found for another topic."""
    from app.knowledge import judging
    from app.knowledge.evaluate import scratch_knowledge_base
    from app.knowledge.prompt import grounded_messages, is_decline, reply_choices
    from app.knowledge.retrieval import Retriever
    from app.llm import GenerationParams, make_backend
    from inference.demo.corpus import HANDBOOKS
    from inference.demo.grounded import (
        DEMO_ANSWER_BY_QUOTING,
        DEMO_CHUNK_TOKENS,
        DEMO_JUDGE_EACH_PASSAGE,
        DEMO_TOP_K,
    )
    from inference.demo.train import SYSTEM_PROMPT

    question = "IT服务台的分机号是多少？"
    with scratch_knowledge_base(HANDBOOKS, str(DEMO), kb_chunk_tokens=DEMO_CHUNK_TOKENS, kb_top_k=DEMO_TOP_K,
                                kb_answer_by_quoting=DEMO_ANSWER_BY_QUOTING,
                                kb_judge_each_passage=DEMO_JUDGE_EACH_PASSAGE) as services:
        retriever, backend = Retriever(services), make_backend(services.settings)

        def answer(passages):
            def messages_over(ps):
                return grounded_messages(SYSTEM_PROMPT, [], question, ps, "IT")

            def params_over(ps):
                return GenerationParams(temperature=0, max_tokens=200, choice=reply_choices(services.settings, ps))

            if judging.judges_each_passage(services.settings, passages):
                return judging.answer_each(backend.generate, messages_over, passages, params_over).text
            return backend.generate(messages_over(passages), params_over(passages)).text

        try:
            passages = retriever.search(question, []).passages
            said = answer(passages)
            assert "8100" in said and re.search(rf"\[[1-{len(passages)}]\]", said), said
            elsewhere = [p for p in retriever.search("公司食堂几点开饭", []).passages if "8100" not in p.text]
            assert elsewhere
            declined = answer(elsewhere)
            assert is_decline(declined.strip()), declined
        finally:
            backend.close()


def test_demo_speculative_greedy_equals_plain_greedy(demo):
    params = SamplingParams(temperature=0, max_tokens=48)
    for item in load_qa()[::60]:
        messages = [{"role": "user", "content": item["question"]}]
        plain = demo.generate(messages, params).token_ids
        for k in range(1, 9):
            assert demo.generate(messages, params, speculative_k=k).token_ids == plain, (
                item["id"],
                k,
            )
