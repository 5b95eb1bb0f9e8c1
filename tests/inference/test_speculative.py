"""MTP speculative decoding: lossless greedy, distribution-preserving sampling, cache rollback."""

import copy

import pytest
import torch

from inference.engine.speculative import Chooser, verify_drafts
from inference.layers.sampler import Sampler
from inference.llm import LLM
from inference.sampling_params import SamplingParams
from tests.inference.helpers import glm5_config, reference_tokens, write_checkpoint


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    """Window 16 / interval 4, so that generations wrap the ring and elect (and roll back) nodes;
    2 MTP heads, so that k > 2 reuses the last head. The lm head is scaled so that greedy has no
    near-ties that float noise between a 1-token and a k-token forward could flip."""
    torch.manual_seed(0)
    raw = glm5_config(num_mtp_heads=2)
    path = write_checkpoint(tmp_path_factory.mktemp("spec") / "m", raw)
    llm = LLM.from_pretrained(path, kv_cache_bytes=1 << 24)
    llm.model.lm_head.weight.data *= 8
    return llm


def test_greedy_speculative_equals_plain_greedy_for_every_k(tiny_llm):
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (1, 5, 13, 21, 40)]
    plain = [reference_tokens(tiny_llm.model, p, params) for p in prompts]
    assert [o.token_ids for o in tiny_llm.generate(prompts, params)] == plain
    for k in range(1, 9):
        spec = [o.token_ids for o in tiny_llm.generate(prompts, params, speculative_k=k)]
        assert spec == plain, k


def test_greedy_with_repetition_penalty_is_lossless_too(tiny_llm):
    params = SamplingParams(temperature=0, repetition_penalty=1.3, max_tokens=20, ignore_eos=True)
    prompt = list(range(10, 30))
    plain = reference_tokens(tiny_llm.model, prompt, params)
    assert tiny_llm.generate([prompt], params)[0].token_ids == plain
    assert tiny_llm.generate([prompt], params, speculative_k=3)[0].token_ids == plain


def test_stats_count_every_draft_position(tiny_llm):
    before = copy.deepcopy(tiny_llm.speculative_stats)
    params = SamplingParams(temperature=0, max_tokens=25, ignore_eos=True)
    assert len(tiny_llm.generate([list(range(5, 15))], params, speculative_k=4)[0].token_ids) == 25
    stats = tiny_llm.speculative_stats.since(before)
    assert stats.rounds > 0 and all(stats.proposed[:4]) and not any(stats.proposed[4:])
    assert all(0 <= a <= p for a, p in zip(stats.accepted, stats.proposed, strict=True))
    assert 1.0 <= stats.mean_accepted_length <= 5.0


def test_k_out_of_range_is_refused(tiny_llm):
    with pytest.raises(ValueError, match="0..8"):
        tiny_llm.add_request([4, 5, 6], speculative_k=9)


def test_rejection_sampling_keeps_the_model_distribution():
    """x ~ q, kept with min(1, p/q), else drawn from norm(max(0, p - q)): the token that comes
    out is distributed as p, whatever q is."""
    torch.manual_seed(0)
    params = SamplingParams(temperature=1.0, seed=7)
    chooser = Chooser(Sampler(), params, torch.Generator().manual_seed(7))
    logits = torch.tensor([[2.0, 0.5, -1.0, 1.0, 0.0, -3.0]])
    p = logits.softmax(-1)[0]
    q = torch.tensor([0.05, 0.5, 0.3, 0.05, 0.1, 0.0])
    trials, counts = 30000, torch.zeros(6)
    draws = torch.multinomial(
        q, trials, replacement=True, generator=torch.Generator().manual_seed(3)
    )
    for x in draws.tolist():
        accepted, extra = verify_drafts(torch.cat((logits, logits)), [x], [q], [0], chooser)
        counts[x if accepted else extra] += 1
    empirical = counts / trials
    assert (empirical - p).abs().max() < 0.015, (empirical, p)


def test_speculative_sampling_is_seeded_and_stops_at_max_tokens(tiny_llm):
    params = SamplingParams(temperature=0.8, top_k=20, seed=5, max_tokens=17, ignore_eos=True)
    a = tiny_llm.generate([[4, 5, 6]], params, speculative_k=3)[0].token_ids
    b = tiny_llm.generate([[4, 5, 6]], params, speculative_k=3)[0].token_ids
    assert a == b and len(a) == 17
