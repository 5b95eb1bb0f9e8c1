"""GLM-4.5-style MoE checkpoints (glm4_moe) made by transformers: the same logits and greedy tokens
as transformers, and every way the engine runs them (cache, chunks, paged batches, prefix cache,
preemption, int8, fp8 and sharded bf16 checkpoints) gives the numbers of one full forward."""

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Glm4MoeConfig
from transformers import Glm4MoeForCausalLM as HfGlm4Moe

from inference.config import ModelConfig
from inference.layers.linear import Int8Linear
from inference.layers.moe import MoE
from inference.llm import LLM
from inference.loader import CheckpointError, dequantize_fp8, load_model
from inference.models import cpu_decode
from inference.models.glm4_moe import Glm4MoeDecoderLayer
from inference.quantize import quantize_checkpoint
from inference.sampling_params import SamplingParams
from tests.inference.engine.conftest import engine_for, random_prompts, reference
from tests.inference.helpers import unsettle_, with_mtp_layer

VOCAB = 160


def hf_config(**overrides) -> Glm4MoeConfig:
    kwargs = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, n_routed_experts=8,
        num_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=1, n_shared_experts=1,
        routed_scaling_factor=2.5, attention_bias=True, use_qk_norm=True, pad_token_id=0,
        eos_token_id=[1, 2], initializer_range=0.2,  # peaky logits: greedy decisions far from ties
    )
    kwargs.update(overrides)
    return Glm4MoeConfig(**kwargs)


def make_hf(seed: int = 1, **overrides) -> HfGlm4Moe:
    """A random model whose router correction biases and norms are not their neutral values, so
    that every one of them changes which experts are chosen or what they give."""
    torch.manual_seed(seed)
    hf = HfGlm4Moe(hf_config(**overrides)).eval()
    return unsettle_(hf)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    hf = make_hf()
    path = tmp_path_factory.mktemp("glm4_moe")
    hf.save_pretrained(path)
    return hf, path


@pytest.fixture(scope="module")
def model(checkpoint):
    return load_model(checkpoint[1], ModelConfig.from_pretrained(checkpoint[1]), "cpu")


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(len(ids)), model.new_cache()))


def test_config_reads_the_moe_fields(model):
    c = model.config
    assert c.mlp_layer_types == ["dense", "sparse", "sparse"]
    assert (c.n_routed_experts, c.num_experts_per_tok, c.n_group, c.topk_group) == (8, 3, 4, 2)
    assert c.routed_scaling_factor == 2.5 and c.use_qk_norm and not c.rotary_interleaved
    assert isinstance(model.model.layers[1].mlp, MoE) and not isinstance(model.model.layers[0].mlp, MoE)


@pytest.mark.parametrize("overrides", [{}, {"n_group": 1, "topk_group": 1, "norm_topk_prob": False,
                                            "use_qk_norm": False, "attention_bias": False, "n_shared_experts": 2,
                                            "tie_word_embeddings": True}],
                         ids=["grouped-qknorm-bias", "ungrouped-plain-tied"])
def test_logits_match_transformers(overrides, tmp_path):
    hf = make_hf(seed=2, **overrides)
    hf.save_pretrained(tmp_path)
    model = load_model(tmp_path, ModelConfig.from_pretrained(tmp_path), "cpu")
    ids = torch.randint(3, VOCAB, (45,))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    torch.testing.assert_close(logits_of(model, ids), expected, atol=1e-4, rtol=0)


def test_greedy_tokens_match_transformers_for_40_steps(checkpoint):
    hf, path = checkpoint
    prompt = torch.randint(3, VOCAB, (9,)).tolist()
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None)
    llm = LLM.from_pretrained(path, device="cpu", kv_cache_bytes=1 << 24)
    result = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    assert result.token_ids == expected[0, 9:].tolist()
    logits = logits_of(llm.model, expected[0])[8:-1]
    top2 = logits.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-3  # not near-ties: the agreement means something


def test_chunked_prefill_and_decode_equal_one_forward(model):
    ids = torch.randint(3, VOCAB, (60,))
    full = logits_of(model, ids)
    cache, outs, a = model.new_cache(), [], 0
    with torch.inference_mode():
        for size in [7, 1, 16, 3, 1, 1, 20, 1, 10]:  # 60: prefill chunks, decode rows, a verify-sized chunk
            outs.append(model.compute_logits(model(ids[a : a + size], torch.arange(a, a + size), cache)))
            a += size
    # fp32 sums in other GEMM shapes (chunks vs one pass; AVX2 and AVX-512 block them differently)
    # differ by ~1e-5: 5e-5 still catches a wrong position, mask or cache entry (a shifted position: 7.5 off)
    torch.testing.assert_close(torch.cat(outs), full, atol=5e-5, rtol=1e-5)


def test_paged_batched_chunked_engine_equals_single_requests(model):
    prompts = random_prompts(5, 3, 150, seed=11)
    engine = engine_for(model, max_num_batched_tokens=40)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs = engine.generate(prompts, params)
    assert [o.token_ids for o in outputs] == reference(model, prompts, params)
    assert engine.block_manager.all_free()


def test_prefix_cache_and_preemption_give_the_same_tokens(model):
    system = random_prompts(1, 130, 131, seed=12)[0]
    prompts = [system + tail for tail in random_prompts(3, 1, 30, seed=13)]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    expected = reference(model, prompts, params)
    engine = engine_for(model)
    engine.generate(prompts[:1], params)
    outputs = engine.generate(prompts, params)
    assert [o.cached_tokens for o in outputs] == [128, 128, 128]
    assert [o.token_ids for o in outputs] == expected
    prompts = random_prompts(6, 20, 120, seed=14)
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    small = engine_for(model, num_blocks=5, max_num_batched_tokens=64)
    assert [o.token_ids for o in small.generate(prompts, params)] == reference(model, prompts, params)
    assert small.scheduler.num_preemptions > 0


def test_window_covering_the_sequence_equals_dense(checkpoint, model):
    path = checkpoint[1]
    sparse = load_model(path, ModelConfig.from_pretrained(path, sliding_window=64, global_interval=8), "cpu")
    ids = torch.randint(3, VOCAB, (50,))
    torch.testing.assert_close(logits_of(sparse, ids), logits_of(model, ids), atol=1e-5, rtol=1e-5)


def test_experts_grouped_by_expert_equal_a_loop_over_tokens(model):
    moe = model.model.layers[1].mlp
    x = torch.randn(37, 64)
    with torch.inference_mode():
        weights, experts = moe.gate(x)
        got = moe.routed(x, weights, experts)
        expected = torch.stack([
            sum(w * moe.experts[e](x[t : t + 1])[0] for w, e in zip(weights[t], experts[t].tolist(), strict=True))
            for t in range(37)
        ])
    assert len(set(experts.flatten().tolist())) > 3  # several experts, several tokens each
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_router_keeps_to_the_best_groups(model):
    gate = model.model.layers[1].mlp.gate
    with torch.inference_mode():
        _, experts = gate(torch.randn(64, 64))
    groups = experts // (8 // 4)  # 4 groups of 2 experts, top-2 groups
    assert all(len(set(row)) <= 2 for row in groups.tolist())


def test_int8_experts_stay_close(checkpoint, model, tmp_path):
    path = checkpoint[1]
    int8 = load_model(path, ModelConfig.from_pretrained(path, quantization="w8a16"), "cpu")
    moe = int8.model.layers[1].mlp
    assert all(type(e.gate_up_proj) is Int8Linear and type(e.down_proj) is Int8Linear for e in moe.experts)
    assert moe.gate.weight.dtype == torch.float32  # the router is not quantized
    ids = torch.randint(3, VOCAB, (30,))
    expected, got = logits_of(model, ids), logits_of(int8, ids)
    # int8 rounding moves a few tokens to other experts in this tiny peaky model (dense: < 1e-2)
    assert (got - expected).norm() / expected.norm() < 0.05
    written = quantize_checkpoint(path, tmp_path / "int8")
    assert load_file(written / "model.safetensors")["model.layers.1.mlp.gate.weight"].dtype == torch.float32
    from_checkpoint = load_model(written, ModelConfig.from_pretrained(written), "cpu")
    torch.testing.assert_close(logits_of(from_checkpoint, ids), got, atol=1e-4, rtol=1e-4)
    prompt = ids[:8].tolist()
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    assert reference(int8, [prompt], params)[0] == engine_for(int8).generate([prompt], params)[0].token_ids


def test_sharded_bf16_checkpoint_keeps_the_router_in_fp32(checkpoint, tmp_path):
    hf, _ = checkpoint
    copy.deepcopy(hf).to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    model = load_model(tmp_path, ModelConfig.from_pretrained(tmp_path), "cpu")
    assert model.lm_head.weight.dtype == torch.bfloat16
    gate = model.model.layers[2].mlp.gate
    assert gate.weight.dtype == gate.e_score_correction_bias.dtype == torch.float32
    ids = torch.randint(3, VOCAB, (16,))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    got = logits_of(model, ids).float()
    assert (got - expected).norm() / expected.norm() < 0.05


def fp8_blocks(weight: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 values and the `weight_scale_inv` factors of `block x block` tiles, as the FP8
    releases store them (partial tiles at the edges)."""
    rows, cols = weight.shape
    grid = torch.zeros(-(-rows // block), -(-cols // block))
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            tile = weight[i * block : (i + 1) * block, j * block : (j + 1) * block]
            grid[i, j] = tile.abs().max().clamp(min=1e-12) / 448.0
    expanded = grid.repeat_interleave(block, 0)[:rows].repeat_interleave(block, 1)[:, :cols]
    return (weight / expanded).to(torch.float8_e4m3fn), grid


def dequantized(fp8_state: dict, block: int) -> dict:
    """An FP8 state back in fp32, each tile times its own factor (what the loader must give)."""
    out = {}
    for name, tensor in fp8_state.items():
        if name.endswith("_scale_inv"):
            continue
        if tensor.dtype == torch.float8_e4m3fn:
            grid = fp8_state[name + "_scale_inv"]
            rows, cols = tensor.shape
            tensor = tensor.float() * grid.repeat_interleave(block, 0)[:rows].repeat_interleave(block, 1)[:, :cols]
        out[name] = tensor
    return out


def test_fp8_checkpoint_loads_within_fp8_error(checkpoint, model, tmp_path):
    _, path = checkpoint
    state = load_file(path / "model.safetensors")
    fp8_state = {}
    for name, tensor in state.items():
        if tensor.dim() == 2 and "proj" in name:  # the linear layers; embeddings, norms, router stay
            fp8_state[name], fp8_state[name + "_scale_inv"] = fp8_blocks(tensor, 16)
        else:
            fp8_state[name] = tensor
    save_file(fp8_state, str(tmp_path / "model.safetensors"))
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 16],
                                     "activation_scheme": "dynamic"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    fp8 = load_model(tmp_path, ModelConfig.from_pretrained(tmp_path), "cpu")
    weight = state["model.layers.1.mlp.experts.3.down_proj.weight"]  # [64, 32]: 4 x 2 tiles
    loaded = fp8.model.layers[1].mlp.experts[3].down_proj.weight
    assert (loaded - weight).abs().max() <= weight.abs().max() / 16  # e4m3: 3 mantissa bits
    assert not torch.equal(loaded, weight)
    # the model is exactly the one of the dequantized weights, each tile times its own factor
    (tmp_path / "plain").mkdir()
    save_file(dequantized(fp8_state, 16), str(tmp_path / "plain" / "model.safetensors"))
    (tmp_path / "plain" / "config.json").write_text((path / "config.json").read_text())
    plain = load_model(tmp_path / "plain", ModelConfig.from_pretrained(tmp_path / "plain"), "cpu")
    ids = torch.randint(3, VOCAB, (24,))
    torch.testing.assert_close(logits_of(fp8, ids), logits_of(plain, ids), atol=1e-5, rtol=1e-5)


def test_fp8_factors_must_cover_the_weight():
    weight = torch.randn(40, 24).to(torch.float8_e4m3fn)
    torch.testing.assert_close(dequantize_fp8(weight, torch.full((3, 2), 2.0), (16, 16)), 2 * weight.float())
    torch.testing.assert_close(dequantize_fp8(weight, torch.tensor(0.5), None), 0.5 * weight.float())
    rows = torch.arange(40.0)
    torch.testing.assert_close(dequantize_fp8(weight, rows[:, None], None), rows[:, None] * weight.float())
    with pytest.raises(CheckpointError, match="do not cover"):
        dequantize_fp8(weight, torch.ones(2, 2), (16, 16))


def test_the_mtp_layer_of_the_checkpoint_loads_beside_the_model(checkpoint, tmp_path):
    """It becomes the model's MTP head (tests/inference/test_glm_mtp.py drafts with it) and
    leaves the model's own logits alone; a config with no MTP layers refuses it by name."""
    hf, path = checkpoint
    state = load_file(path / "model.safetensors")
    save_file(with_mtp_layer(state, 2, 64, "shared_head.head"), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    model = load_model(tmp_path, ModelConfig.from_pretrained(tmp_path), "cpu")  # num_nextn_predict_layers 1
    assert model.config.num_mtp_heads == 1 and len(model.model.mtp) == 1
    ids = torch.randint(3, VOCAB, (12,))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    torch.testing.assert_close(logits_of(model, ids), expected, atol=1e-4, rtol=0)
    (tmp_path / "config.json").write_text(json.dumps({**json.loads((path / "config.json").read_text()),
                                                      "num_nextn_predict_layers": 0}))
    with pytest.raises(CheckpointError, match="unexpected tensor model.layers.3.eh_proj.weight"):
        load_model(tmp_path, ModelConfig.from_pretrained(tmp_path), "cpu")


@pytest.mark.usefixtures("cpu_kernels_built")
def test_the_cpu_fast_path_leaves_moe_layers_to_their_own_forward(model):
    layer = model.model.layers[1]
    assert type(layer) is Glm4MoeDecoderLayer  # not swapped for a fused version
    with torch.inference_mode():
        for layer in model.model.layers:  # dense leading layer too: q/k norms and half rotary
            assert cpu_decode.plan(layer, torch.randn(1, 64)) is None
            assert cpu_decode.plan(layer, torch.randn(cpu_decode.MAX_ROWS, 64)) is None


@pytest.mark.parametrize("bad, message", [
    ({"n_group": 3}, "groups"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"topk_group": 1, "num_experts_per_tok": 3}, "topk_group"),
    ({"mlp_layer_types": ["dense", "moe", "sparse"]}, "mlp_layer_types"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_inconsistent_moe_configs_are_refused(bad, message):
    raw = {**hf_config().to_dict(), "model_type": "glm4_moe", **bad}
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict(raw)


def test_cli_generates_what_transformers_generates(tmp_path, capsys):
    from inference.__main__ import main
    from inference.tokenizer import ChatTokenizer

    demo = Path(__file__).resolve().parents[2] / "models" / "demo"
    hf = make_hf(seed=3, vocab_size=4096)
    hf.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(demo / name, tmp_path / name)
    tokenizer = ChatTokenizer.from_pretrained(tmp_path)
    prompt = "年假怎么申请"
    ids = tokenizer.encode(prompt)
    with torch.no_grad():
        expected = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None)
    assert main(["generate", "--model", str(tmp_path), "--prompt", prompt, "--max-tokens", "12",
                 "--temperature", "0", "--ignore-eos"]) == 0
    assert capsys.readouterr().out == tokenizer.decode(expected[0, len(ids):].tolist()) + "\n"
