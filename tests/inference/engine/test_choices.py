"""Decoding constrained to given replies (`SamplingParams.choice`): the model picks, the reply is
exactly one of them, and the rest of it comes without a forward per token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inference.engine import EngineArgs, LLMEngine
from inference.engine.choices import Choices, mask_to_allowed
from inference.sampling_params import SamplingParams
from tests.inference.engine.conftest import engine_for

DEMO = Path(__file__).resolve().parents[3] / "models" / "demo"
QUESTION = [{"role": "user", "content": "年假有几天？"}]
OTHERS = ["请联系 IT 服务台。", "Sorry, I could not find this in the knowledge base."]


def test_choices_allow_only_continuations_and_finish_the_last_one_left():
    choices = Choices([[5, 6, 7], [5, 8], [5, 6, 7], []], eos_token_id=0)
    assert choices.replies == [[5, 6, 7, 0], [5, 8, 0]]  # duplicates and empty ones dropped
    assert choices.allowed([]) == [5]
    assert choices.allowed([5]) == [6, 8]
    assert choices.rest([5]) == []  # two still fit
    assert choices.rest([5, 6]) == [7, 0]
    assert choices.allowed([5, 8]) == [0]
    assert choices.allowed([9]) == []
    with pytest.raises(ValueError, match="no reply"):
        Choices([[]], eos_token_id=0)


def test_masking_keeps_only_the_allowed_tokens_of_constrained_rows():
    logits = torch.arange(12, dtype=torch.float32).view(2, 6)
    masked = mask_to_allowed(logits, [[1, 3], None])
    assert masked[0].argmax().item() == 3 and torch.isinf(masked[0, [0, 2, 4, 5]]).all()
    assert torch.equal(masked[1], logits[1])
    assert torch.equal(logits, torch.arange(12, dtype=torch.float32).view(2, 6))  # not in place


def test_params_refuse_empty_choices_and_ignore_eos():
    with pytest.raises(ValueError, match="non-empty"):
        SamplingParams(choice=["ok", " "])
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(choice=["ok"], ignore_eos=True)


@pytest.fixture(scope="module")
def demo():
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(DEMO), max_num_seqs=8, max_model_len=512,
                                                   speculative_k=3))
    free = engine.generate([QUESTION], SamplingParams(temperature=0, max_tokens=80))[0]
    assert free.finish_reason == "stop", "the demo model answers this within 80 tokens"
    return engine, free.text.strip()


@pytest.mark.parametrize("position", [0, 1, 2])
def test_the_model_picks_the_reply_it_would_write_wherever_it_is_listed(demo, position):
    engine, own = demo
    choice = list(OTHERS)
    choice.insert(position, own)
    out = engine.generate([QUESTION], SamplingParams(temperature=0, max_tokens=200, choice=choice))[0]
    assert out.text.strip() == own and out.finish_reason == "stop"


def test_a_reply_it_would_not_write_is_still_written_exactly(demo):
    engine, own = demo
    out = engine.generate([QUESTION], SamplingParams(temperature=0, max_tokens=200, choice=OTHERS))[0]
    assert out.text.strip() in OTHERS
    sampled = engine.generate([QUESTION] * 4, [SamplingParams(temperature=1.0, seed=s, max_tokens=200, choice=OTHERS)
                                               for s in range(4)])
    assert all(o.text.strip() in OTHERS for o in sampled)


def test_once_one_reply_is_left_it_is_written_in_the_same_step(demo):
    engine, _ = demo
    # two long replies that part at their first token (not the model's own reply, whose length
    # changes with each retrain of the demo model)
    replies = [f"请联系 IT 服务台（分机 8100），工作日 08:30–19:00 有人接听。{OTHERS[0]}", OTHERS[1]]
    request = engine.add_request(QUESTION, SamplingParams(temperature=0, max_tokens=200, choice=replies))
    steps, final = 0, None
    while final is None:
        steps += 1
        final = next((o for o in engine.step() if o.request_id == request and o.finished), None)
    assert final.text.strip() in replies
    tokens = len(engine.tokenizer.reply_ids(final.text.strip()))
    assert tokens > 10
    assert steps <= 4, f"{steps} steps for {tokens} tokens"  # the prompt, then the choice, then the rest at once


def test_a_constrained_request_leaves_its_batch_neighbours_unchanged(demo):
    engine, own = demo
    other = [{"role": "user", "content": "VPN 怎么连？"}]
    alone = engine.generate([other], SamplingParams(temperature=0, max_tokens=40))[0]
    both = engine.generate([QUESTION, other], [SamplingParams(temperature=0, max_tokens=200, choice=OTHERS),
                                               SamplingParams(temperature=0, max_tokens=40)])
    assert both[0].text.strip() in OTHERS and both[1].token_ids == alone.token_ids


def test_choices_need_a_tokenizer(model):
    engine = engine_for(model)
    with pytest.raises(ValueError, match="tokenizer"):
        engine.add_request([3, 4, 5], SamplingParams(choice=["a"]))
