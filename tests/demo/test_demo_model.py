"""The shipped demo checkpoint (`models/demo`): it loads, answers handbook questions, and MTP
speculative greedy decoding gives exactly its plain greedy answers."""

import re
from pathlib import Path

import pytest

from demo.corpus import load_qa
from inference.llm import LLM
from inference.sampling_params import SamplingParams
from tests.inference.helpers import reference_tokens

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


def test_demo_answers_from_the_passage_that_holds_the_answer(demo):
    """Asked as the worker asks, over the demo handbook in the knowledge base: it quotes the
    passage that answers, with its number, and says "not found" in the rules' words when the
    passages do not answer."""
    from app.knowledge.evaluate import scratch_knowledge_base
    from app.knowledge.prompt import grounded_messages, is_decline
    from app.knowledge.retrieval import Retriever
    from demo.corpus import HANDBOOKS
    from demo.grounded import DEMO_CHUNK_TOKENS, DEMO_TOP_K
    from demo.train import SYSTEM_PROMPT

    params = SamplingParams(temperature=0, max_tokens=120)
    with scratch_knowledge_base(HANDBOOKS, kb_chunk_tokens=DEMO_CHUNK_TOKENS,
                                kb_top_k=DEMO_TOP_K) as services:
        retriever = Retriever(services)
        question = "IT服务台的分机号是多少？"
        passages = retriever.search(question, []).passages
        answer = demo.generate([grounded_messages(SYSTEM_PROMPT, [], question, passages, "IT")],
                               params)[0].text
        assert "8100" in answer and re.search(r"\[[1-3]\]", answer), answer
        elsewhere = [p for p in retriever.search("公司食堂几点开饭", []).passages
                     if "8100" not in p.text]
        declined = demo.generate([grounded_messages(SYSTEM_PROMPT, [], question, elsewhere, "IT")],
                                 params)[0].text
        assert is_decline(declined.strip()), declined


def test_demo_speculative_greedy_equals_plain_greedy(demo):
    """The questions in one batch, plain and at every k, against each decoded alone on the
    model's one-sequence cache."""
    params = SamplingParams(temperature=0, max_tokens=48)
    questions = [[{"role": "user", "content": item["question"]}] for item in load_qa()[::60]]
    plain = [reference_tokens(demo.model, demo.prompt_ids(q), params, demo.eos_token_ids) for q in questions]
    for k in range(0, 9):
        assert [o.token_ids for o in demo.generate(questions, params, speculative_k=k)] == plain, k
