"""The MTP layer of the published GLM-4.5+ / GLM-4.7-Flash / GLM-5 checkpoints (layer
`num_hidden_layers`, DeepSeek-V3's layout) loads and drafts for speculative decoding.

transformers drops that layer, so each test writes one into a tiny transformers-saved checkpoint
under the published names: a decoder layer's tensors (`self_attn.*`, with GLM-5's indexer,
`mlp.*` MoE, the two layernorms) plus `enorm`, `hnorm`, `eh_proj`, `shared_head.norm`, and the
copies of the embedding and lm head (`embed_tokens`, `shared_head.head`) that the loader skips.
"""

import copy

import pytest
import torch
from safetensors.torch import load_file, save_file

from inference.config import ModelConfig
from inference.engine import EngineArgs
from inference.layers.moe import MoE
from inference.llm import LLM
from inference.loader import CheckpointError, load_model
from inference.sampling_params import SamplingParams
from tests.inference import test_glm4_moe, test_glm4_moe_lite, test_glm_moe_dsa
from tests.inference.engine.conftest import engine_for, random_prompts, reference

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
FAMILIES = {  # model type: (its test module, a decoder layer with an MoE (GLM-5: and an indexer))
    "glm_moe_dsa": (test_glm_moe_dsa, 2),
    "glm4_moe": (test_glm4_moe, 2),
    "glm4_moe_lite": (test_glm4_moe_lite, 2),
}


def add_mtp_layer(path, source: int, seed: int = 7, only: tuple[str, ...] | None = None,
                  noise: float = 0.05) -> dict:
    """Write layer `num_hidden_layers` into the checkpoint at `path` as the published ones carry
    it: layer `source`'s tensor names (values perturbed) and the MTP extras. Returns them."""
    file = path / "model.safetensors"
    state = load_file(file)
    layers = ModelConfig.from_pretrained(path).num_hidden_layers
    g = torch.Generator().manual_seed(seed)
    hidden = state["model.embed_tokens.weight"].shape[1]
    mtp, prefix = {}, f"model.layers.{source}."
    for name, tensor in state.items():
        if name.startswith(prefix):
            jitter = torch.randn(tensor.shape, generator=g) * noise * tensor.float().std().nan_to_num(0)
            mtp[f"model.layers.{layers}." + name.removeprefix(prefix)] = tensor + jitter
    m = f"model.layers.{layers}."
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        mtp[f"{m}{norm}.weight"] = 1 + 0.3 * torch.randn(hidden, generator=g)
    mtp[f"{m}eh_proj.weight"] = torch.randn(hidden, 2 * hidden, generator=g) / (2 * hidden) ** 0.5
    mtp[f"{m}embed_tokens.weight"] = state["model.embed_tokens.weight"].clone()  # copies: not read
    mtp[f"{m}shared_head.head.weight"] = state.get("lm_head.weight", state["model.embed_tokens.weight"]).clone()
    if only is not None:
        mtp = {n: t for n, t in mtp.items() if n.removeprefix(m).startswith(only)}
    save_file({**state, **mtp}, file, metadata={"format": "pt"})
    return mtp


@pytest.fixture(scope="module")
def dsa(tmp_path_factory):
    """A tiny GLM-5 (4 layers, indexer pattern FSFS) with an MTP layer written in."""
    path = tmp_path_factory.mktemp("glm5_mtp")
    test_glm_moe_dsa.make_hf().save_pretrained(path)
    written = add_mtp_layer(path, source=2)
    return path, written, load_model(path, ModelConfig.from_pretrained(path), "cpu")


def test_the_published_names_load_into_an_mtp_module(dsa):
    path, written, model = dsa
    assert model.config.num_nextn_predict_layers == 1 and model.config.num_mtp_heads == 1
    mtp = model.model.mtp[0]
    assert mtp.block.self_attn.indexer is not None  # a full DSA layer: its own indexer
    assert isinstance(mtp.block.mlp, MoE)
    names = set(written)
    for name in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
                 "self_attn.indexer.wk.weight", "self_attn.kv_a_proj_with_mqa.weight", "mlp.gate.weight",
                 "mlp.experts.0.gate_proj.weight", "mlp.shared_experts.down_proj.weight", "input_layernorm.weight"):
        assert f"model.layers.4.{name}" in names
    assert torch.equal(mtp.eh_proj.weight, written["model.layers.4.eh_proj.weight"])
    assert torch.equal(mtp.shared_head.norm.weight, written["model.layers.4.shared_head.norm.weight"])
    assert torch.equal(mtp.block.self_attn.indexer.wk.weight, written["model.layers.4.self_attn.indexer.wk.weight"])
    assert torch.equal(mtp.block.mlp.gate.weight, written["model.layers.4.mlp.gate.weight"].float())
    assert not any("embed_tokens" in n or "shared_head.head" in n for n, _ in mtp.named_parameters())


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_single_request_speculative_greedy_equals_plain_greedy(dsa, k):
    path, _, model = dsa
    llm = LLM.from_pretrained(path, device="cpu", speculative_k=k, kv_cache_bytes=1 << 24)
    for prompt in random_prompts(3, 1, 30, seed=k):
        plain = llm.generate([prompt], GREEDY, speculative_k=0)[0].token_ids
        before = copy.deepcopy(llm.speculative_stats)
        assert llm.generate([prompt], GREEDY)[0].token_ids == plain, (len(prompt), k)
        stats = llm.speculative_stats.since(before)
        # the first token is the prefill's and the next the first decode step's (its drafter has
        # no verified hidden state to start from yet); a last round may accept drafts past max_tokens
        assert stats.rounds > 0 and len(plain) - 2 <= stats.emitted <= len(plain) - 2 + k
        assert all(0 <= a <= p for a, p in zip(stats.accepted, stats.proposed, strict=True))


def test_batched_engine_speculative_greedy_equals_plain_greedy(dsa):
    model = dsa[2]
    prompts = random_prompts(8, 1, 40, seed=3)
    ks = [1, 0, 2, 3, 4, 2, 0, 4]
    engine = engine_for(model, num_blocks=64, block_size=16, max_num_batched_tokens=48)
    ids = [engine.add_request(p, GREEDY, speculative_k=k) for p, k in zip(prompts, ks, strict=True)]
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out.token_ids
    assert [final[i] for i in ids] == reference(model, prompts, GREEDY)
    stats = engine.speculative_stats
    assert stats.rounds > 0 and sum(stats.proposed) > 0
    assert all(0 <= a <= p for a, p in zip(stats.accepted, stats.proposed, strict=True))


def test_an_mtp_layer_that_copies_the_model_drafts_what_it_says(tmp_path):
    """A one-layer GLM-5 whose MTP layer is that layer again, fed only `enorm(embed(next))`
    (eh_proj [I ; 0], embedding rows of unit RMS so that enorm changes nothing) and normed by the
    model's own final norm: depth 0 at position j then runs the model on token j + 1 (with the
    context one token shorter), so its drafts are mostly what the model says: accepted, single
    request and batched, and the output is still exactly plain greedy's."""
    test_glm_moe_dsa.make_hf(num_hidden_layers=1, index_topk_pattern="F", first_k_dense_replace=0).save_pretrained(tmp_path)
    add_mtp_layer(tmp_path, source=0, noise=0)
    state = load_file(tmp_path / "model.safetensors")
    embed = state["model.embed_tokens.weight"]
    state["model.embed_tokens.weight"] = embed / embed.pow(2).mean(-1, keepdim=True).sqrt()
    hidden = embed.shape[1]
    state["model.layers.1.eh_proj.weight"] = torch.cat((torch.eye(hidden), torch.zeros(hidden, hidden)), dim=1)
    state["model.layers.1.enorm.weight"] = torch.ones(hidden)
    state["model.layers.1.shared_head.norm.weight"] = state["model.norm.weight"].clone()
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    llm = LLM.from_pretrained(tmp_path, device="cpu", kv_cache_bytes=1 << 24)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = [[7] * 12, [9, 10, 11, 40, 50, 60, 70]]
    plain = [llm.generate([p], params)[0].token_ids for p in prompts]
    for prompt, expected in zip(prompts, plain, strict=True):
        before = copy.deepcopy(llm.speculative_stats)
        assert llm.generate([prompt], params, speculative_k=4)[0].token_ids == expected
        stats = llm.speculative_stats.since(before)
        assert sum(stats.accepted) >= 0.5 * sum(stats.proposed) and stats.mean_accepted_length > 2.5
    engine = engine_for(llm.model, num_blocks=16, block_size=16)
    ids = [engine.add_request(p, params, speculative_k=4) for p in prompts]
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out.token_ids
    assert [final[i] for i in ids] == plain
    stats = engine.speculative_stats
    assert sum(stats.accepted) >= 0.5 * sum(stats.proposed)


@pytest.mark.parametrize("model_type", ["glm4_moe", "glm4_moe_lite"])
def test_the_other_families_draft_with_their_mtp_layer(model_type, tmp_path):
    module, source = FAMILIES[model_type]
    module.make_hf().save_pretrained(tmp_path)
    add_mtp_layer(tmp_path, source)
    model = load_model(tmp_path, ModelConfig.from_pretrained(tmp_path), "cpu")
    assert model.config.num_mtp_heads == 1 and isinstance(model.model.mtp[0].block.mlp, MoE)
    llm = LLM(model, args=EngineArgs(kv_cache_bytes=1 << 24), eos_token_ids=[])
    prompts = random_prompts(2, 1, 30, seed=5)
    plain = [llm.generate([p], GREEDY)[0].token_ids for p in prompts]
    for k in (1, 3):
        assert [llm.generate([p], GREEDY, speculative_k=k)[0].token_ids for p in prompts] == plain
    engine = engine_for(model, num_blocks=32, block_size=16)
    ids = [engine.add_request(p, GREEDY, speculative_k=2) for p in prompts]
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out.token_ids
    assert [final[i] for i in ids] == plain


def test_a_checkpoint_without_the_mtp_layer_loads_and_refuses_speculation(tmp_path):
    test_glm_moe_dsa.make_hf().save_pretrained(tmp_path)
    lacks = r"lacks the MTP layer model\.layers\.4\.\*"
    with pytest.raises(ValueError, match=lacks):
        LLM.from_pretrained(tmp_path, device="cpu", speculative_k=2, kv_cache_bytes=1 << 24)
    llm = LLM.from_pretrained(tmp_path, device="cpu", kv_cache_bytes=1 << 24)
    assert llm.model.config.num_nextn_predict_layers == 1 and llm.model.config.num_mtp_heads == 0
    assert len(llm.model.model.mtp) == 0
    assert llm.generate([[5, 6, 7]], GREEDY)[0].token_ids  # plain decoding works
    with pytest.raises(ValueError, match=lacks):
        llm.generate([[5, 6, 7]], GREEDY, speculative_k=2)
    with pytest.raises(ValueError, match=lacks):
        engine_for(llm.model, speculative_k=2)


def test_a_partial_mtp_layer_is_reported_by_name(tmp_path):
    test_glm_moe_dsa.make_hf().save_pretrained(tmp_path)
    add_mtp_layer(tmp_path, source=2, only=("eh_proj", "enorm", "hnorm"))
    with pytest.raises(CheckpointError, match=r"missing tensor model\.layers\.4\.shared_head\.norm\.weight"):
        load_model(tmp_path, ModelConfig.from_pretrained(tmp_path), "cpu")
