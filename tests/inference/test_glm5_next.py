"""GLM-5.3-Flash-style checkpoints (glm5_next: KDA linear attention, pooled DSA over MLA without
rotary, manifold hyper-connections, clamped SwiGLU, MoE) made by transformers 5.24 in the
published layout (`Glm5NextForConditionalGeneration`, the text model under
`model.language_model.`, a vision tower the engine does not load): the same logits and greedy
tokens with `index_topk` far below the length, and every way the engine runs them (a cache
filled in chunks, one token a call, the paged engine's batches, chunked prefill, preemption)
gives one full forward's numbers; prefix caching is refused for the family."""

import copy
import logging

import pytest
import torch
from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

from inference.config import ModelConfig
from inference.layers.caches.layouts import cache_layout
from inference.layers.kda import KDAttention, state_bytes
from inference.layers.pooled_dsa import PooledDSAttention, PooledIndexer
from inference.llm import LLM
from inference.loader import load_model
from inference.sampling_params import SamplingParams
from tests.inference.engine.conftest import engine_for, random_prompts, reference
from tests.inference.helpers import unsettle_

VOCAB, TOPK, POOL = 160, 8, 4


def text_config(**overrides) -> dict:
    kwargs = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, kv_lora_rank=24,
        q_lora_rank=32, qk_rope_head_dim=0, qk_nope_head_dim=16, v_head_dim=12, index_topk=TOPK, index_head_dim=16,
        index_n_heads=4, index_kpool=POOL, linear_head_dim=8, linear_num_heads=4, linear_conv_kernel_dim=4, hc_mult=4,
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"], swiglu_limit=3.0, pad_token_id=0, eos_token_id=[1, 2],
        initializer_range=0.2,  # peaky logits: greedy decisions far from ties
    )
    kwargs.update(overrides)
    return kwargs


VISION = dict(depth=1, hidden_size=32, num_heads=2, out_hidden_size=64, intermediate_size=32,
              projection_intermediate_size=32, patch_size=14)


def make_hf(seed: int = 1, tie: bool = False, **overrides) -> Glm5NextForConditionalGeneration:
    """A random model whose every parameter matters: router biases and norms off their neutral
    values, the KDA gates, pool weights and hyper-connections' biases and scales random (their
    init is zeros or ones), the mixing moderate (fp32 noise stays below 1e-4 in the logits)."""
    torch.manual_seed(seed)
    hf = Glm5NextForConditionalGeneration(Glm5NextConfig(text_config=text_config(**overrides), vision_config=VISION,
                                                         tie_word_embeddings=tie)).eval()
    unsettle_(hf)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("compress_ape", "compress_gate", "dt_bias", "A_log")):
                p.normal_(0, 0.5)
            elif name.endswith(("hc.base", "hc.scale")):
                p.normal_(0, 0.3)
            elif name.endswith("hc.fn"):
                p.normal_(0, 0.1)
    return hf


def hf_logits(hf, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=ids[None]).logits[0]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    hf = make_hf()
    path = tmp_path_factory.mktemp("glm5_next")
    hf.save_pretrained(path)
    return hf, path


@pytest.fixture(scope="module")
def model(checkpoint):
    return load_model(checkpoint[1], ModelConfig.from_pretrained(checkpoint[1]), "cpu")


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(len(ids)), model.new_cache()))


def boundary_ties(model, ids: torch.Tensor) -> list[int]:
    """Positions whose indexer ranked a pool equal to the best one left out (scores of exactly 0
    where every head's ReLU is 0): torch's top-k keeps one of them by where its selection
    leaves it, which depends on the row's length, so a chunked run may keep another than one
    full forward (transformers' cached generation against its own full forward alike)."""
    found = []
    select = PooledIndexer.select

    def noted(self, x, q_resid, keys, positions):
        pooled = self.pooled(keys)
        q = self.wq_b(q_resid).view(x.shape[0], self.heads, self.head_dim).float()
        scores = torch.matmul(q, pooled.t()[None]).mul(self.head_dim**-0.5).relu()
        index = torch.matmul((self.weights_proj(x).float() * self.heads**-0.5)[:, None], scores)[:, 0]
        k = self.topk // self.pool
        for row, position in zip(index, positions.tolist(), strict=True):
            ranked = row[: (position + 1) // self.pool].sort(descending=True).values
            if len(ranked) > k and ranked[k - 1] == ranked[k]:
                found.append(position)
        return select(self, x, q_resid, keys, positions)

    PooledIndexer.select = noted
    try:
        logits_of(model, ids)
    finally:
        PooledIndexer.select = select
    return found


def tie_free_ids(model, length: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(50):
        ids = torch.randint(3, VOCAB, (length,), generator=gen)
        if not boundary_ties(model, ids):
            return ids
    raise AssertionError("no tie-free input in 50 draws")


def test_the_published_layout_loads_as_the_text_model(checkpoint, model):
    """The vision tower's tensors are in the checkpoint and not read; the layers are what
    `layer_types` says (three KDA, then one sparse with its indexer)."""
    from safetensors import safe_open

    with safe_open(checkpoint[1] / "model.safetensors", "pt") as f:
        names = list(f.keys())
    assert any(n.startswith("model.visual.") for n in names)
    assert "model.language_model.layers.0.self_attn.q_conv1d.weight" in names
    assert "model.language_model.layers.0.hc_attn_fn" in names
    assert model.config.layer_types == ["linear_attention"] * 3 + ["indexed_attention"]
    kinds = [type(layer.self_attn) for layer in model.model.layers]
    assert kinds == [KDAttention] * 3 + [PooledDSAttention]
    assert model.model.layers[3].self_attn.indexer is not None


@pytest.mark.parametrize("overrides", [{}, {"index_kpool_always_select_tail": False, "index_n_heads": 1,
                                            "layer_types": ["linear_attention", "indexed_attention",
                                                            "indexed_attention", "linear_attention"],
                                            "indexer_types": ["full", "full", "shared", "full"],
                                            "linear_lower_bound": None, "tie": True}],
                         ids=["flash-layout", "shared-sparse-layer-no-tail-softplus-gate-tied"])
def test_logits_match_transformers_with_topk_far_below_the_length(overrides, tmp_path):
    """70 positions, 17 complete pools, 2 of them (plus the tail) a query. The model's own
    fp32 noise is measured too: transformers in float64 against its fp32 result."""
    hf = make_hf(seed=2, **overrides)
    hf.save_pretrained(tmp_path)
    model = load_model(tmp_path, ModelConfig.from_pretrained(tmp_path), "cpu")
    ids = torch.randint(3, VOCAB, (70,))
    expected = hf_logits(hf, ids)
    got = logits_of(model, ids)
    # fp32 noise differs by CPU and by the fp32 matmul kernel `Fp32Matmul` times as fastest: on an
    # Intel Xeon (AVX-512) ours was 6.9e-5 from float64 where transformers' was 2.8e-5 (before the
    # KDA's running sums of the gates were summed in float64); on a 2-core AMD EPYC ours is
    # 5.1-5.7e-5 and 2.6-3.1e-5 on the two configs, transformers' 6.8e-5 and 5.0e-5, ours from
    # theirs at most 4.2e-5; a wrong state, pool or position is 0.1 and more off
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=0)
    exact = copy.deepcopy(hf).double()
    for module in exact.modules():  # the grouped-mm experts take no float64
        if hasattr(getattr(module, "config", None), "_experts_implementation"):
            module.config._experts_implementation = "eager"
    truth = hf_logits(exact, ids).float()
    assert (got - truth).abs().max() <= max(1.5 * (expected - truth).abs().max(), 1e-4)  # fp32 noise only


def test_the_choice_matters(model):
    """A model whose indexer took every pool would give other logits: the selection is real."""
    ids = torch.randint(3, VOCAB, (60,))
    sparse = logits_of(model, ids)
    indexer = model.model.layers[3].self_attn.indexer
    indexer.topk = 10_000
    try:
        dense = logits_of(model, ids)
    finally:
        indexer.topk = TOPK
    torch.testing.assert_close(dense[:TOPK], sparse[:TOPK], atol=1e-5, rtol=1e-5)  # up to two pools: all seen
    assert (dense[TOPK + POOL :] - sparse[TOPK + POOL :]).abs().max() > 1e-2


def test_greedy_tokens_match_transformers_for_40_steps(checkpoint):
    hf, path = checkpoint
    prompt = torch.randint(3, VOCAB, (9,)).tolist()
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None)
    llm = LLM.from_pretrained(path, device="cpu")
    result = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    assert result.token_ids == expected[0, 9:].tolist()


def test_chunked_prefill_and_decode_equal_one_forward(model):
    """Chunks across pool and KDA-chunk boundaries (64 positions), one token a call after them
    (on an input without tied pool scores, `boundary_ties`)."""
    ids = tie_free_ids(model, 90, seed=41)
    full = logits_of(model, ids)
    cache, outs, a = model.new_cache(), [], 0
    with torch.inference_mode():
        for size in [5, 1, 3, 66, 1, 1, 2, 3, 1, 7]:
            outs.append(model.compute_logits(model(ids[a : a + size], torch.arange(a, a + size), cache)))
            a += size
        for t in range(a, len(ids)):
            outs.append(model.compute_logits(model(ids[t : t + 1], torch.tensor([t]), cache)))
    # the delta rule summed by chunks of other sizes and by steps: the model's own fp32 noise,
    # 1.1-3.6e-5 on a 2-core AMD EPYC whichever fp32 matmul kernel (1.5-3.3e-4 while the KDA
    # chunk summed its gates in fp32); a wrong state, pool or position is 0.1 and more off
    torch.testing.assert_close(torch.cat(outs), full, atol=1e-4, rtol=0)


def test_paged_batched_and_preempted_equal_single_requests(model, caplog):
    """Sequences of the paged engine's batches (chunked prefill, decode rows of several
    sequences in one recurrent step, preempted and recomputed ones) give what one request alone
    gives; the KDA states of finished sequences are dropped; prefix caching is off, with the
    reason logged."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = random_prompts(5, 3, 70, seed=31)
    with caplog.at_level(logging.WARNING, logger="inference.engine.llm_engine"):
        engine = engine_for(model, max_num_batched_tokens=24, block_size=8)
    assert "prefix caching is off" in caplog.text
    assert not engine.block_manager.enable_prefix_caching if hasattr(engine.block_manager, "enable_prefix_caching") \
        else True
    expected = reference(model, prompts, params)
    assert [o.token_ids for o in engine.generate(prompts, params)] == expected
    shared = [prompts[0] + tail for tail in random_prompts(3, 1, 9, seed=32)]
    engine.generate(shared[:1], params)
    outputs = engine.generate(shared, params)
    assert [o.cached_tokens for o in outputs] == [0, 0, 0]
    assert [o.token_ids for o in outputs] == reference(model, shared, params)
    small = engine_for(model, num_blocks=12, block_size=8, max_num_batched_tokens=32)
    assert [o.token_ids for o in small.generate(prompts, params)] == expected
    assert small.scheduler.num_preemptions > 0
    assert engine.block_manager.all_free() and small.block_manager.all_free()
    engine.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    assert len(engine.runner.cache.states) <= 1  # the finished sequences' states were dropped


def test_the_cache_keeps_latents_keys_and_a_state_that_does_not_grow(model):
    config = model.config
    layout = cache_layout(config)
    # one sparse layer, full: a latent row and the indexer's [key ; gate] a position
    assert layout.bytes_per_token(torch.float32) == (config.kv_lora_rank + 2 * config.index_head_dim) * 4
    assert layout.bytes_per_sequence() == 3 * state_bytes(config)
    cache = model.new_cache()
    with torch.inference_mode():
        model(torch.randint(3, VOCAB, (40,)), torch.arange(40), cache)
        states = [cache.layers[i].nbytes() for i in range(3)]
        model(torch.randint(3, VOCAB, (300,)), torch.arange(40, 340), cache)
    assert [cache.layers[i].nbytes() for i in range(3)] == states == [state_bytes(config)] * 3


def test_bf16_stays_as_close_as_transformers_bf16(checkpoint, model):
    """bf16 weights and activations: as far from fp32 as transformers' own model in bf16 (the
    hyper-connections' mixing weights, gates and router stay fp32 in both)."""
    hf, path = checkpoint
    half = load_model(path, ModelConfig.from_pretrained(path, dtype="bf16"), "cpu")
    hf_half = copy.deepcopy(hf).to(torch.bfloat16)
    ids = torch.randint(3, VOCAB, (30,))
    indexers = [m.model.layers[3].self_attn.indexer for m in (model, half)]
    hf_indexers = [h.model.language_model.layers[3].self_attn.indexer for h in (hf, hf_half)]
    for indexer in indexers:  # bf16 rounding moves some of the choices of a tiny random model
        indexer.topk = 10_000
    for indexer in hf_indexers:
        indexer.index_topk = 10_000
    try:
        expected, got = logits_of(model, ids), logits_of(half, ids).float()
        theirs = (hf_logits(hf_half, ids).float() - hf_logits(hf, ids)).norm() / expected.norm()
    finally:
        for indexer in indexers:
            indexer.topk = TOPK
        for indexer in hf_indexers:
            indexer.index_topk = TOPK
    assert (got - expected).norm() / expected.norm() < max(0.05, 1.5 * theirs)


@pytest.mark.parametrize("kernels", [False, True], ids=["torch", "compiled"])
def test_a_query_with_nothing_picked_attends_to_nothing(kernels, tmp_path):
    """Without the tail, a query before its first complete pool picks nothing: transformers'
    SDPA gives such a row zeros (its mask is all False). The torch path gave NaN there (the
    softmax of nothing); found by the shape sweep with the compiled kernels off."""
    from tests.inference.shape_sweep import cpu_kernels_set

    hf = make_hf(seed=3, index_kpool_always_select_tail=False)
    hf.save_pretrained(tmp_path)
    ids = torch.randint(3, VOCAB, (30,))
    with cpu_kernels_set(kernels):
        model = load_model(tmp_path, ModelConfig.from_pretrained(tmp_path), "cpu")
        got = logits_of(model, ids)
    torch.testing.assert_close(got, hf_logits(hf, ids), atol=1e-4, rtol=0)
