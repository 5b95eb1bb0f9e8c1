"""GLM-4 checkpoints made by transformers run with the same logits and greedy tokens."""

import pytest
import torch
from transformers import Glm4Config
from transformers import Glm4ForCausalLM as HfGlm4

from inference.config import ModelConfig
from inference.llm import LLM
from inference.loader import load_model
from inference.sampling_params import SamplingParams


def hf_config(**overrides):
    kwargs = dict(
        vocab_size=160,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        pad_token_id=0,
        eos_token_id=[1, 2],
        initializer_range=0.2,  # peaky logits: greedy decisions are far from ties
    )
    kwargs.update(overrides)
    return Glm4Config(**kwargs)


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def checkpoint(request, tmp_path_factory):
    torch.manual_seed(1)
    hf = HfGlm4(hf_config(tie_word_embeddings=request.param)).eval()
    path = tmp_path_factory.mktemp("glm4")
    hf.save_pretrained(path)
    return hf, path


def test_logits_match_transformers(checkpoint):
    hf, path = checkpoint
    model = load_model(path, ModelConfig.from_pretrained(path), "cpu")
    ids = torch.randint(3, 160, (37,))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
        got = model.compute_logits(model(ids, torch.arange(37), model.new_cache()))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_greedy_tokens_match_transformers(checkpoint):
    hf, path = checkpoint
    prompt = torch.randint(3, 160, (9,)).tolist()
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None)
    llm = LLM.from_pretrained(path, device="cpu", kv_cache_bytes=1 << 24)
    result = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    assert result.token_ids == expected[0, 9:].tolist()
    # the decisions are not near-ties, so agreement is meaningful
    model = llm.model
    with torch.no_grad():
        ids = expected[0]
        logits = model.compute_logits(model(ids, torch.arange(len(ids)), model.new_cache()))[8:-1]
    top2 = logits.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-3


def test_window_covering_the_sequence_equals_dense(checkpoint):
    _, path = checkpoint
    dense = load_model(path, ModelConfig.from_pretrained(path), "cpu")
    sparse = load_model(path, ModelConfig.from_pretrained(path, sliding_window=64, global_interval=8), "cpu")
    ids = torch.randint(3, 160, (50,))
    with torch.no_grad():
        a = dense.compute_logits(dense(ids, torch.arange(50), dense.new_cache()))
        b = sparse.compute_logits(sparse(ids, torch.arange(50), sparse.new_cache()))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_bf16_override_stays_close(checkpoint):
    hf, path = checkpoint
    model = load_model(path, ModelConfig.from_pretrained(path, dtype="bf16"), "cpu")
    assert model.lm_head.weight.dtype == torch.bfloat16
    ids = torch.randint(3, 160, (16,))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
        got = model.compute_logits(model(ids, torch.arange(16), model.new_cache())).float()
    assert (got - expected).norm() / expected.norm() < 0.05
