"""The shipped demo checkpoint (`models/demo`): it loads, answers handbook questions, and MTP
speculative greedy decoding gives exactly its plain greedy answers."""

from pathlib import Path

import pytest

from inference.demo.corpus import load_qa
from inference.llm import LLM
from inference.sampling_params import SamplingParams

DEMO = Path(__file__).resolve().parents[3] / "models" / "demo"
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


def test_demo_answers_the_it_extension(demo):
    answer = demo.generate(
        [{"role": "user", "content": "IT服务台的分机号是多少？"}], SamplingParams(temperature=0)
    ).text
    assert "8100" in answer


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
