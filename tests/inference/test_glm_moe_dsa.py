"""GLM-5-style checkpoints (glm_moe_dsa: MLA + DeepSeek Sparse Attention + MoE) made by
transformers: the same logits and greedy tokens with `index_topk` far below the sequence length
and shared indexer layers, and every way the engine runs them gives one full forward's numbers."""

import pytest
import torch
from transformers import GlmMoeDsaConfig
from transformers import GlmMoeDsaForCausalLM as HfGlmMoeDsa

from inference.config import ModelConfig
from inference.layers.caches.layouts import cache_layout
from inference.layers.dsa import DSAttention
from inference.llm import LLM
from inference.loader import load_model
from inference.sampling_params import SamplingParams
from tests.inference.engine.conftest import engine_for, random_prompts, reference
from tests.inference.helpers import unsettle_

VOCAB, TOPK = 160, 6


def hf_config(**overrides) -> GlmMoeDsaConfig:
    kwargs = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8,
        v_head_dim=12, moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
        topk_group=1, first_k_dense_replace=1, n_shared_experts=1, index_topk=TOPK, index_n_heads=8,
        index_head_dim=16, index_topk_pattern="FSFS", pad_token_id=0, eos_token_id=[1, 2],
        initializer_range=0.2,  # peaky logits: greedy decisions far from ties
    )
    kwargs.update(overrides)
    return GlmMoeDsaConfig(**kwargs)


def make_hf(seed: int = 1, **overrides) -> HfGlmMoeDsa:
    torch.manual_seed(seed)
    hf = HfGlmMoeDsa(hf_config(**overrides)).eval()
    return unsettle_(hf)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    hf = make_hf()
    path = tmp_path_factory.mktemp("glm_moe_dsa")
    hf.save_pretrained(path)
    return hf, path


@pytest.fixture(scope="module")
def model(checkpoint):
    return load_model(checkpoint[1], ModelConfig.from_pretrained(checkpoint[1]), "cpu")


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(len(ids)), model.new_cache()))


def test_config_and_layers(model):
    assert model.config.indexer_types == ["full", "shared", "full", "shared"]
    assert [layer.self_attn.indexer is not None for layer in model.model.layers] == [True, False, True, False]
    assert all(type(layer.self_attn) is DSAttention for layer in model.model.layers)


@pytest.mark.parametrize("overrides", [{}, {"index_topk_pattern": "FFFF", "index_topk": 3, "n_group": 1,
                                            "topk_group": 1, "tie_word_embeddings": True}],
                         ids=["shared-layers", "every-layer-indexed-topk3-tied"])
def test_logits_match_transformers_with_topk_far_below_the_length(overrides, tmp_path):
    hf = make_hf(seed=2, **overrides)
    hf.save_pretrained(tmp_path)
    model = load_model(tmp_path, ModelConfig.from_pretrained(tmp_path), "cpu")
    ids = torch.randint(3, VOCAB, (48,))  # 48 positions, 3 or 6 chosen a query
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    torch.testing.assert_close(logits_of(model, ids), expected, atol=1e-4, rtol=0)


def test_the_choice_matters(model):
    """A model that saw every position would give other logits: the selection is real."""
    ids = torch.randint(3, VOCAB, (40,))
    sparse = logits_of(model, ids)
    for layer in model.model.layers:
        if layer.self_attn.indexer is not None:
            layer.self_attn.indexer.topk = 10_000
    try:
        dense = logits_of(model, ids)
    finally:
        for layer in model.model.layers:
            if layer.self_attn.indexer is not None:
                layer.self_attn.indexer.topk = TOPK
    torch.testing.assert_close(dense[:TOPK], sparse[:TOPK], atol=1e-5, rtol=1e-5)  # fewer than k: all seen
    assert (dense[TOPK:] - sparse[TOPK:]).abs().max() > 1e-2


def test_greedy_tokens_match_transformers_for_36_steps(checkpoint):
    hf, path = checkpoint
    prompt = torch.randint(3, VOCAB, (9,)).tolist()
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=36, do_sample=False, eos_token_id=None)
    llm = LLM.from_pretrained(path, device="cpu", kv_cache_bytes=1 << 24)
    result = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=36, ignore_eos=True))[0]
    assert result.token_ids == expected[0, 9:].tolist()


def test_chunked_prefill_and_decode_equal_one_forward(model):
    ids = torch.randint(3, VOCAB, (50,))
    full = logits_of(model, ids)
    cache, outs, a = model.new_cache(), [], 0
    with torch.inference_mode():
        for size in [5, 1, 12, 3, 1, 1, 17, 1, 9]:
            outs.append(model.compute_logits(model(ids[a : a + size], torch.arange(a, a + size), cache)))
            a += size
    # fp32 sums in other GEMM shapes (chunks vs one pass; AVX2 and AVX-512 block them differently)
    # differ by ~1e-5: 5e-5 still catches a wrong position, mask or cache entry (a shifted position: 7.5 off)
    torch.testing.assert_close(torch.cat(outs), full, atol=5e-5, rtol=1e-5)


def test_paged_batched_prefix_cached_and_preempted_equal_single_requests(model):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    prompts = random_prompts(5, 3, 120, seed=21)
    engine = engine_for(model, max_num_batched_tokens=40)
    assert [o.token_ids for o in engine.generate(prompts, params)] == reference(model, prompts, params)
    system = random_prompts(1, 130, 131, seed=22)[0]
    shared = [system + tail for tail in random_prompts(3, 1, 20, seed=23)]
    engine.generate(shared[:1], params)
    outputs = engine.generate(shared, params)
    assert [o.cached_tokens for o in outputs] == [128, 128, 128]
    assert [o.token_ids for o in outputs] == reference(model, shared, params)
    small = engine_for(model, num_blocks=5, max_num_batched_tokens=64)
    assert [o.token_ids for o in small.generate(prompts, params)] == reference(model, prompts, params)
    assert small.scheduler.num_preemptions > 0
    assert engine.block_manager.all_free() and small.block_manager.all_free()


def test_the_cache_keeps_latents_and_the_full_layers_keys(model):
    config = model.config
    layout = cache_layout(config)
    per_token = 4 * (config.kv_lora_rank + config.qk_rope_head_dim) + 2 * config.index_head_dim  # 4 layers, 2 full
    assert layout.bytes_per_token(torch.float32) == per_token * 4
    pools = layout.paged_cache(3, 16, torch.float32, torch.device("cpu"))
    assert pools.nbytes() == 3 * layout.bytes_per_block(16, torch.float32)


def test_int8_stays_close(checkpoint, model):
    path = checkpoint[1]
    int8 = load_model(path, ModelConfig.from_pretrained(path, quantization="w8a16"), "cpu")
    ids = torch.randint(3, VOCAB, (30,))
    # int8 rounding moves some of 6-of-30 choices in this tiny random model: compare where the
    # indexers see every position, then check the engine's int8 runs against its own reference
    for m in (model, int8):
        for layer in m.model.layers:
            if layer.self_attn.indexer is not None:
                layer.self_attn.indexer.topk = 10_000
    try:
        expected, got = logits_of(model, ids), logits_of(int8, ids)
    finally:
        for m in (model, int8):
            for layer in m.model.layers:
                if layer.self_attn.indexer is not None:
                    layer.self_attn.indexer.topk = TOPK
    assert (got - expected).norm() / expected.norm() < 0.05
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = random_prompts(3, 10, 40, seed=24)
    assert [o.token_ids for o in engine_for(int8).generate(prompts, params)] == reference(int8, prompts, params)


@pytest.mark.parametrize("heads, topk, seed", [(1, 5, 0), (2, 8, 2), (4, 6, 1)])
def test_few_indexer_heads_match_transformers_where_scores_tie(heads, topk, seed, tmp_path):
    """With 1, 2 or 4 indexer heads many keys score exactly 0 (every head's ReLU zero), and
    often more of them than places left at the top-k boundary. Which of those torch's top-k keeps
    (transformers) is where its selection algorithm leaves them; the compiled kernel kept the
    earliest, another choice: logits 0.5-4 off from the first tied position on (#54). The kernel
    now refuses those rows and torch chooses them: prefill and one-step decode both match."""
    hf = make_hf(seed=seed, index_n_heads=heads, index_topk=topk)
    hf.save_pretrained(tmp_path)
    model = load_model(tmp_path, ModelConfig.from_pretrained(tmp_path), "cpu")
    torch.manual_seed(seed)
    ids = torch.randint(3, VOCAB, (40,))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    torch.testing.assert_close(logits_of(model, ids), expected, atol=1e-4, rtol=0)
    cache, steps = model.new_cache(), []
    with torch.inference_mode():
        model(ids[:30], torch.arange(30), cache)
        for t in range(30, 40):  # a decode row scores the keys of 0..t: the kernel's other path
            steps.append(model.compute_logits(model(ids[t : t + 1], torch.tensor([t]), cache)))
    with torch.no_grad():
        out = hf(ids[None, :30], use_cache=True)
        past, hf_steps = out.past_key_values, []
        for t in range(30, 40):
            out = hf(ids[None, t : t + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            hf_steps.append(out.logits[0])
    torch.testing.assert_close(torch.cat(steps), torch.cat(hf_steps), atol=1e-4, rtol=0)
