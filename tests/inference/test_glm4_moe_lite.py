"""GLM-4.7-Flash-style checkpoints (glm4_moe_lite: MLA + GLM's MoE) made by transformers: the same
logits and greedy tokens as transformers, whichever way the attention runs (absorbed into latent
space or expanded per head), and every way the engine runs them (cache, chunks, paged batches,
prefix cache, preemption, int8, fp8) gives the numbers of one full forward, on a cache of
latents."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Glm4MoeLiteConfig
from transformers import Glm4MoeLiteForCausalLM as HfGlm4MoeLite

from inference.config import ModelConfig
from inference.engine.model_runner import ModelRunner
from inference.layers import mla
from inference.layers.caches.layouts import cache_layout
from inference.layers.caches.mla import MLALayerCache, MLALayout
from inference.layers.linear import Int8Linear
from inference.layers.mla import LatentProjection
from inference.layers.moe import MoE
from inference.llm import LLM
from inference.loader import CheckpointError, load_model
from inference.models import cpu_decode
from inference.models.glm4_moe_lite import Glm4MoeLiteDecoderLayer
from inference.plan import make_plan, tensor_bytes, tensors
from inference.quantize import quantize_checkpoint
from inference.sampling_params import SamplingParams
from tests.inference.engine.conftest import engine_for, random_prompts, reference
from tests.inference.helpers import unsettle_, with_mtp_layer
from tests.inference.test_glm4_moe import fp8_blocks

VOCAB = 160
FLASH_CONFIG = Path(__file__).resolve().parents[2] / "inference" / "configs" / "glm-4.7-flash.json"
LATENT = 32 + 8  # kv_lora_rank + qk_rope_head_dim
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 16,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.7, "rope_theta": 10000.0}


def hf_config(**overrides) -> Glm4MoeLiteConfig:
    kwargs = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=12, qk_rope_head_dim=8,
        v_head_dim=10, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
        n_shared_experts=1, routed_scaling_factor=2.5, pad_token_id=0, eos_token_id=[1, 2],
        initializer_range=0.2,  # peaky logits: greedy decisions far from ties
    )
    kwargs.update(overrides)
    return Glm4MoeLiteConfig(**kwargs)


def make_hf(seed: int = 1, **overrides) -> HfGlm4MoeLite:
    """A random model with router correction biases and norms away from their neutral values."""
    torch.manual_seed(seed)
    hf = HfGlm4MoeLite(hf_config(**overrides)).eval()
    return unsettle_(hf)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    hf = make_hf()
    path = tmp_path_factory.mktemp("glm4_moe_lite")
    hf.save_pretrained(path)
    return hf, path


@pytest.fixture(scope="module")
def model(checkpoint):
    return load_model(checkpoint[1], ModelConfig.from_pretrained(checkpoint[1]), "cpu")


def run_expanded_from(monkeypatch, rows: int) -> None:
    """Every sequence's chunk of `rows` or more rows runs expanded per head, smaller ones absorbed."""
    monkeypatch.setattr(mla.MLAttention, "expands", lambda self, new, total: new >= rows)


@pytest.fixture(params=["absorbed", "expanded"])
def attention_path(request, monkeypatch):
    """Every chunk of 2 rows or more absorbed into latent space, or expanded per head (single
    rows are always absorbed); the tile of absorbed queries small enough to be crossed."""
    run_expanded_from(monkeypatch, 10**9 if request.param == "absorbed" else 2)
    monkeypatch.setattr(mla, "ABSORBED_TILE", 5)
    return request.param


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(len(ids)), model.new_cache()))


def test_config_reads_the_mla_fields(model):
    c = model.config
    assert (c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim) == (24, 32, 12, 8, 10)
    assert c.rotary_interleaved and c.rotary_dim == c.head_dim == 8 and c.rope_scaling is None
    assert c.mlp_layer_types == ["dense", "sparse", "sparse"] and c.num_nextn_predict_layers == 1
    assert isinstance(model.model.layers[1].mlp, MoE) and not isinstance(model.model.layers[0].mlp, MoE)
    assert isinstance(cache_layout(c), MLALayout)


def test_published_glm47_flash_config_reads_and_agrees_with_the_planner():
    raw = json.loads(FLASH_CONFIG.read_text())
    c = ModelConfig.from_dict(raw)
    assert (c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim) == (768, 512, 192, 64, 256)
    assert c.rotary_dim == 64 and c.rotary_interleaved and c.rope_theta == 1e6 and c.rms_norm_eps == 1e-5
    plan = make_plan(raw, "int8")
    assert cache_layout(c).bytes_per_token(torch.bfloat16) == plan.kv.total == 47 * 576 * 2
    kv_b = next(t for t in tensors(plan.arch) if t.name.endswith("layers.1.self_attn.kv_b_proj.weight"))
    assert tensor_bytes(kv_b, "int8") == 2 * kv_b.numel  # kept dense, as the engine keeps it


@pytest.mark.parametrize("overrides", [
    {},
    {"q_lora_rank": None},
    {"rope_interleave": False},
    {"attention_bias": True, "tie_word_embeddings": True, "n_group": 1, "topk_group": 1, "norm_topk_prob": False},
    {"rope_parameters": YARN, "max_position_embeddings": 128},
], ids=["q-lora-interleaved", "no-q-lora", "rope-halves", "bias-tied-ungrouped", "yarn"])
def test_logits_match_transformers(overrides, attention_path, tmp_path):
    hf = make_hf(seed=2, **overrides)
    hf.save_pretrained(tmp_path)
    model = load_model(tmp_path, ModelConfig.from_pretrained(tmp_path), "cpu")
    if "rope_parameters" in overrides:  # the scaling is live: both of its factors differ from 1
        assert model.rotary.magnitude != 1 and model.model.layers[0].self_attn.scale != (12 + 8) ** -0.5
    ids = torch.randint(3, VOCAB, (45,))  # YaRN: past its original 32 positions
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


def test_chunked_prefill_and_decode_equal_one_forward(model, monkeypatch):
    run_expanded_from(monkeypatch, 8)
    monkeypatch.setattr(mla, "ABSORBED_TILE", 3)
    ids = torch.randint(3, VOCAB, (60,))
    full = logits_of(model, ids)  # one expanded chunk from position 0 (causal SDPA)
    cache, outs, a = model.new_cache(), [], 0
    with torch.inference_mode():
        for size in [7, 1, 16, 3, 1, 1, 20, 1, 10]:  # 60: absorbed and expanded chunks after a context
            outs.append(model.compute_logits(model(ids[a : a + size], torch.arange(a, a + size), cache)))
            a += size
    # the two forms sum the same products in other orders: ~1e-5 apart on these peaky logits
    torch.testing.assert_close(torch.cat(outs), full, atol=5e-5, rtol=1e-5)


def test_the_cost_model_absorbs_decode_and_short_chunks_and_expands_long_prefill():
    config = ModelConfig.from_dict(json.loads(FLASH_CONFIG.read_text()))
    with torch.device("meta"):
        attention = mla.MLAttention(config)
    assert not attention.expands(1, 100_000) and not attention.expands(mla.EXPAND_MIN_ROWS - 1, mla.EXPAND_MIN_ROWS - 1)
    assert attention.expands(mla.EXPAND_MIN_ROWS, mla.EXPAND_MIN_ROWS)  # a fresh prefill
    assert attention.expands(2048, 2048 + 8192) and not attention.expands(256, 256 + 8192)
    assert attention.expanded_width == 19_200 and not attention.expands(2048, 2048 + 14_000)  # 1 GB in fp32


def test_a_mixed_step_gives_each_sequence_its_own_numbers(model, monkeypatch):
    """Steps with long chunks (expanded) beside decode rows and short chunks (absorbed): the
    scheduler makes steps of (24), (9, 15), (1, 8, 15), (1, 1, 21) rows here."""
    run_expanded_from(monkeypatch, 10)
    prompts = random_prompts(3, 20, 40, seed=21)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine = engine_for(model, max_num_batched_tokens=24)
    assert [o.token_ids for o in engine.generate(prompts, params)] == reference(model, prompts, params)


def test_rolled_back_positions_are_forgotten(model):
    ids = torch.randint(3, VOCAB, (30,))
    cache = model.new_cache()
    with torch.inference_mode():
        model(ids[:20], torch.arange(20), cache)
        model(torch.randint(3, VOCAB, (5,)), torch.arange(20, 25), cache)  # rejected drafts, say
        cache.truncate(20)
        assert cache.length == 20
        got = model.compute_logits(model(ids[20:], torch.arange(20, 30), cache))
    torch.testing.assert_close(got, logits_of(model, ids)[20:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        cache.truncate(31)


def test_paged_batched_chunked_engine_equals_single_requests(model, attention_path):
    prompts = random_prompts(5, 3, 150, seed=11)
    engine = engine_for(model, max_num_batched_tokens=40)  # prompts in chunks beside decode rows
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs = engine.generate(prompts, params)
    assert [o.token_ids for o in outputs] == reference(model, prompts, params)
    assert engine.block_manager.all_free()


def test_prefix_cache_and_preemption_give_the_same_tokens(model, attention_path):
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


def test_the_cache_holds_one_latent_row_per_position_and_layer(model):
    layout = cache_layout(model.config)
    layers = model.config.num_hidden_layers
    assert layout.bytes_per_token(torch.float32) == layers * LATENT * 4  # kv_lora_rank + qk_rope_head_dim
    assert layout.bytes_per_token(torch.bfloat16) == layers * LATENT * 2
    runner = ModelRunner(model, num_blocks=7, block_size=16)
    pools = runner.cache
    assert pools.latents.shape == (layers, 7 * 16, LATENT) and pools.num_node_pages == 0
    assert pools.nbytes() == 7 * layout.bytes_per_block(16, torch.float32)
    engine = engine_for(model, num_blocks=9)
    assert engine.runner.cache.nbytes() == 9 * layout.bytes_per_block(64, torch.float32)
    assert engine.max_model_len == 9 * 64
    one = MLALayerCache(LATENT, torch.float32, torch.device("cpu"), max_positions=300)
    with torch.inference_mode():
        one.extend(torch.randn(300, LATENT))
    assert one.nbytes() == layout.layer_cache_bytes(torch.float32, 300) == 300 * LATENT * 4
    with pytest.raises(ValueError, match="made for 300"):
        one.extend(torch.randn(1, LATENT))
    cache = model.new_cache()
    logits_of(model, torch.randint(3, VOCAB, (10,)))
    with torch.inference_mode():
        model(torch.randint(3, VOCAB, (10,)), torch.arange(10), cache)
    assert all(layer.latents.shape[1] == LATENT for layer in cache.layers)  # no per-head K/V anywhere


def test_int8_keeps_the_latent_projection_dense_and_stays_close(checkpoint, model, tmp_path):
    path = checkpoint[1]
    int8 = load_model(path, ModelConfig.from_pretrained(path, quantization="w8a16"), "cpu")
    attn = int8.model.layers[1].self_attn
    assert all(type(m) is Int8Linear for m in (attn.q_a_proj, attn.q_b_proj, attn.kv_a_proj_with_mqa, attn.o_proj))
    assert type(attn.kv_b_proj) is LatentProjection and attn.kv_b_proj.weight.dtype == torch.float32
    ids = torch.randint(3, VOCAB, (30,))
    expected, got = logits_of(model, ids), logits_of(int8, ids)
    assert (got - expected).norm() / expected.norm() < 0.05
    written = quantize_checkpoint(path, tmp_path / "int8")
    state = load_file(written / "model.safetensors")
    assert state["model.layers.1.self_attn.kv_b_proj.weight"].dtype == torch.float32  # kept dense there too
    assert state["model.layers.1.self_attn.q_b_proj.weight"].dtype == torch.int8
    from_checkpoint = load_model(written, ModelConfig.from_pretrained(written), "cpu")
    torch.testing.assert_close(logits_of(from_checkpoint, ids), got, atol=1e-4, rtol=1e-4)
    prompts = [ids[:8].tolist(), ids[10:30].tolist()]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    assert reference(int8, prompts, params) == [o.token_ids for o in engine_for(int8).generate(prompts, params)]


def test_fp8_checkpoint_loads_as_its_dequantized_weights(checkpoint, tmp_path):
    _, path = checkpoint
    state = load_file(path / "model.safetensors")
    fp8_state, dequantized = {}, {}
    for name, tensor in state.items():
        if tensor.dim() == 2 and "proj" in name:  # every linear, kv_b_proj too, as the FP8 release
            values, grid = fp8_state[name], fp8_state[name + "_scale_inv"] = fp8_blocks(tensor, 16)
            rows, cols = tensor.shape
            tensor = values.float() * grid.repeat_interleave(16, 0)[:rows].repeat_interleave(16, 1)[:, :cols]
        else:
            fp8_state[name] = tensor
        dequantized[name] = tensor
    config = json.loads((path / "config.json").read_text())
    (tmp_path / "plain").mkdir()
    save_file(dequantized, str(tmp_path / "plain" / "model.safetensors"))
    (tmp_path / "plain" / "config.json").write_text(json.dumps(config))
    save_file(fp8_state, str(tmp_path / "model.safetensors"))
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 16]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    fp8 = load_model(tmp_path, ModelConfig.from_pretrained(tmp_path), "cpu")
    weight = state["model.layers.1.self_attn.kv_b_proj.weight"]
    loaded = fp8.model.layers[1].self_attn.kv_b_proj.weight
    assert (loaded - weight).abs().max() <= weight.abs().max() / 16 and not torch.equal(loaded, weight)
    plain = load_model(tmp_path / "plain", ModelConfig.from_pretrained(tmp_path / "plain"), "cpu")
    ids = torch.randint(3, VOCAB, (24,))
    torch.testing.assert_close(logits_of(fp8, ids), logits_of(plain, ids), atol=1e-5, rtol=1e-5)


def test_bf16_keeps_the_router_in_fp32_and_stays_close(checkpoint, model):
    path = checkpoint[1]
    bf16 = load_model(path, ModelConfig.from_pretrained(path, dtype="bf16"), "cpu")
    assert bf16.model.layers[1].self_attn.kv_b_proj.weight.dtype == torch.bfloat16
    assert bf16.model.layers[1].mlp.gate.weight.dtype == torch.float32
    ids = torch.randint(3, VOCAB, (24,))
    expected = logits_of(model, ids)
    assert bf16.new_cache().layers[0].latents.dtype == torch.bfloat16
    got = logits_of(bf16, ids).float()
    assert (got - expected).norm() / expected.norm() < 0.05


def test_the_mtp_layer_of_the_checkpoint_loads_beside_the_model(checkpoint, tmp_path):
    """It becomes the model's MTP head (tests/inference/test_glm_mtp.py drafts with it) and
    leaves the model's own logits alone; a config with no MTP layers refuses it by name."""
    hf, path = checkpoint
    state = load_file(path / "model.safetensors")
    save_file(with_mtp_layer(state, 2, 64, "embed_tokens"), str(tmp_path / "model.safetensors"))
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
def test_the_cpu_fast_path_leaves_mla_layers_to_their_own_forward(model):
    assert all(type(layer) is Glm4MoeLiteDecoderLayer for layer in model.model.layers)
    with torch.inference_mode():
        for layer in model.model.layers:
            assert cpu_decode.plan(layer, torch.randn(1, 64)) is None


@pytest.mark.parametrize("bad, message", [
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"kv_lora_rank": 0}, "kv_lora_rank"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}, "rope_type"),
    ({"sliding_window": 64, "global_interval": 8}, "sliding-window"),
])
def test_inconsistent_mla_configs_are_refused(bad, message):
    raw = {**hf_config().to_dict(), "model_type": "glm4_moe_lite", **bad}
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
    assert main(["generate", "--model", str(tmp_path), "--prompt", prompt, "--max-tokens", "12",
                 "--temperature", "0", "--ignore-eos", "--quantization", "w8a16"]) == 0
    assert capsys.readouterr().out.strip()  # int8 streams text too
