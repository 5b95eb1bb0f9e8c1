"""`python -m inference plan`: parameter counts and KV bytes against transformers' own models and
caches, the shipped configs' sizes by hand, the byte rules per dtype, and the command's verdict."""

import json
import math
import tomllib
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, GlmMoeDsaConfig

from inference.__main__ import main
from inference.configs import CONFIGS_DIR
from inference.plan import (
    FP32,
    GIB,
    HEAD,
    LINEAR,
    REMOTE_HINT,
    Tensor,
    make_plan,
    parse_config,
    run,
    tensor_bytes,
)

ROOT = Path(__file__).resolve().parents[2]
AIR = CONFIGS_DIR / "glm-4.5-air.json"
FLASH = CONFIGS_DIR / "glm-4.7-flash.json"
GLM5 = CONFIGS_DIR / "glm-5.json"
GLM47 = CONFIGS_DIR / "glm-4.7.json"

SMALL = dict(vocab_size=101, hidden_size=48, intermediate_size=72, pad_token_id=0)
MOE = dict(moe_intermediate_size=24, n_routed_experts=6, num_experts_per_tok=2)
MLA = dict(kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10)
# Tiny configs that exercise every branch: bias on/off, tied head, qk norm, two shared experts,
# mlp_layer_types, no q LoRA, attention bias on MLA, and a DSA layer pattern with shared indexers.
TINY = {
    "glm4": dict(
        model_type="glm4", num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, attention_bias=True, **SMALL,
    ),
    "glm4-tied-nobias": dict(
        model_type="glm4", num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, attention_bias=False, tie_word_embeddings=True, **SMALL,
    ),
    "glm4_moe": dict(
        model_type="glm4_moe", num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=20, attention_bias=True, use_qk_norm=True, n_shared_experts=2,
        first_k_dense_replace=2, num_nextn_predict_layers=1, **SMALL, **MOE,
    ),
    "glm4_moe_lite": dict(
        model_type="glm4_moe_lite", num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, n_shared_experts=1, q_lora_rank=None, attention_bias=True,
        mlp_layer_types=["dense", "sparse", "dense"], **SMALL, **MOE, **MLA,
    ),
    "glm_moe_dsa": dict(
        model_type="glm_moe_dsa", num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, n_shared_experts=1, q_lora_rank=20, index_n_heads=2,
        index_head_dim=8, first_k_dense_replace=1, index_topk_pattern="FSFS", **SMALL, **MOE, **MLA,
    ),
}  # fmt: skip


def transformers_model(config: dict):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(**config)).eval()


def transformers_count(model) -> int:
    """Parameters plus the router's e_score_correction_bias (a buffer, but a checkpoint tensor)."""
    buffers = (b for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    return sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in buffers)


@pytest.fixture(scope="module", params=list(TINY), ids=list(TINY))
def tiny(request):
    config = TINY[request.param]
    return config, transformers_model(config)


def test_parameter_count_matches_transformers(tiny):
    config, model = tiny
    assert make_plan(config).params == transformers_count(model)


def test_active_parameters_are_the_model_less_unrouted_experts_and_embedding(tiny):
    config, model = tiny
    plan = make_plan(config)
    routed = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    top_k, experts = config.get("num_experts_per_tok", 0), config.get("n_routed_experts", 1)
    unread = routed - routed * top_k // experts
    embedding = model.get_input_embeddings().weight.numel()
    tied = config.get("tie_word_embeddings", False)
    assert plan.active_params == transformers_count(model) - unread - (0 if tied else embedding)
    head = 0 if tied else model.get_output_embeddings().weight.numel()
    assert plan.active_core_params == plan.active_params - (embedding if tied else head)


def test_kv_bytes_per_token_match_transformers_cache(tiny):
    """transformers caches GQA K/V, the MLA latent (kv_lora + rope) and DSA indexer keys; a bf16
    cache of T tokens holds 2 B x its values."""
    config, model = tiny
    tokens = 7
    with torch.no_grad():
        out = model(torch.arange(tokens)[None] % 50, use_cache=True)
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    values = sum(
        t.numel() for layer in cache.layers for t in vars(layer).values() if torch.is_tensor(t)
    )
    assert make_plan(config).kv.total == 2 * values // tokens


@pytest.mark.parametrize(
    "extra",
    [{}, {"index_topk_freq": 4, "index_skip_topk_offset": 3}, {"index_topk_freq": 2}],
    ids=["default", "freq4-offset3", "freq2"],
)
def test_indexer_layers_resolve_as_transformers_does(extra):
    config = dict(TINY["glm_moe_dsa"], num_hidden_layers=11, index_topk_pattern=None, **extra)
    del config["index_topk_pattern"]
    hf = GlmMoeDsaConfig(**{k: v for k, v in config.items() if k != "model_type"})
    assert list(parse_config(config).indexer_types) == hf.indexer_types


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def test_glm45_air_kv_per_token_by_hand():
    c = read(AIR)
    by_hand = c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * c["head_dim"] * 2
    assert by_hand == 46 * 2 * 8 * 128 * 2 == 188_416
    plan = make_plan(c)
    assert plan.kv.total == plan.kv.attention == by_hand
    assert plan.kv.indexer == 0


def test_glm47_flash_kv_is_the_mla_latent_and_says_what_mha_would_cost():
    c = read(FLASH)
    kv = make_plan(c).kv
    assert kv.total == c["num_hidden_layers"] * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * 2
    assert kv.total == 47 * 576 * 2
    heads = c["num_attention_heads"]
    per_layer = heads * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"]) + heads * c["v_head_dim"]
    assert kv.mha_equivalent == 47 * per_layer * 2 == 47 * 10240 * 2


def test_glm5_kv_adds_the_indexer_key_cache():
    c = read(GLM5)
    kv = make_plan(c).kv
    assert kv.attention == 78 * (512 + 64) * 2
    assert kv.indexer == 78 * c["index_head_dim"] * 2  # every layer runs its indexer
    assert kv.total == kv.attention + kv.indexer == 109_824


@pytest.mark.parametrize(
    ("path", "total", "active"),
    [(AIR, (105e9, 108e9), (11.5e9, 12.5e9)), (FLASH, (29e9, 31e9), (2.9e9, 3.5e9)),
     (GLM5, (740e9, 748e9), (39e9, 41e9)), (GLM47, (350e9, 358e9), (31e9, 33e9))],
    ids=["glm-4.5-air", "glm-4.7-flash", "glm-5", "glm-4.7"],
)  # fmt: skip
def test_shipped_configs_land_on_the_published_sizes(path, total, active):
    """106B/A12B, 30B/A3B, 744B/A40B, 355B/A32B; published "A" figures leave out embedding and head."""
    plan = make_plan(read(path))
    assert total[0] < plan.params < total[1]
    assert active[0] < plan.active_core_params < active[1]


def test_mtp_layer_is_one_moe_layer_plus_its_projections_and_norms():
    c = read(AIR)
    h = c["hidden_size"]
    one_more_layer = make_plan(dict(c, num_hidden_layers=47)).params - make_plan(c).params
    plan = make_plan(c)
    assert plan.mtp_params == one_more_layer + 2 * h * h + 3 * h  # eh_proj, enorm/hnorm/shared norm
    no_mtp = make_plan(dict(c, num_nextn_predict_layers=0))
    assert no_mtp.params == plan.params and no_mtp.mtp_params == 0


def test_byte_rules_per_dtype():
    w = Tensor("w", (300, 200), LINEAR, copies=3)
    assert tensor_bytes(w, "bf16") == 3 * 300 * 200 * 2
    assert tensor_bytes(w, "int8") == 3 * (300 * 200 + 4 * 300)  # a fp32 scale per output row
    assert tensor_bytes(w, "fp8") == 3 * (300 * 200 + 4 * 3 * 2)  # a fp32 scale per 128x128 block
    head = Tensor("lm_head.weight", (1000, 64), HEAD)
    assert tensor_bytes(head, "int8") == 1000 * 64 + 4 * 1000
    assert tensor_bytes(head, "fp8") == tensor_bytes(head, "bf16") == 1000 * 64 * 2
    assert tensor_bytes(Tensor("bias", (8,), FP32), "int8") == 32


def test_quantized_weights_are_about_half():
    air = read(AIR)
    bf16, int8, fp8 = (make_plan(air, dtype).weight_bytes for dtype in ("bf16", "int8", "fp8"))
    assert 0.5 < int8 / bf16 < 0.52 and 0.5 < fp8 / bf16 < 0.52


def test_glm5_does_not_fit_one_gpu_at_bf16_and_points_to_the_remote_backend(capsys):
    assert main(["plan", "--config", str(GLM5)]) == 1
    out = capsys.readouterr().out
    assert "does not fit" in out
    assert "serve it across GPUs with vLLM or SGLang and set INFERENCE_BACKEND=openai" in out
    assert "docs/deploy.md" in out
    plan = make_plan(read(GLM5))
    assert f"at least {math.ceil(plan.weight_bytes / (137 * GIB))} such GPUs" in out
    assert "MTP layers        +" in out and "not included" in out


def test_glm47_flash_fits_and_says_how_many_sequences(capsys):
    assert main(["plan", "--config", str(FLASH), "--gpu-mem-gib", "141"]) == 0
    out = capsys.readouterr().out
    plan = make_plan(read(FLASH))
    tokens = (141 * GIB - 4 * GIB - plan.weight_bytes) // (47 * 576 * 2)
    assert f"fits: {tokens:,} tokens of KV cache = {tokens // 202752:,} concurrent" in out
    assert "202,752 tokens per sequence (the model's max_position_embeddings)" in out
    assert "4.0 GiB is kept in reserve" in out


def test_glm45_air_fits_at_int8_only():
    assert run(str(AIR), "bf16")[0] == 1
    code, text = run(str(AIR), "int8")
    assert code == 0 and "fits:" in text


def test_context_flag_and_default():
    code, text = run(str(FLASH), context=4096, gpu_mem_gib=80)
    assert code == 0 and "4,096 tokens per sequence (--context)" in text
    config = read(FLASH)
    del config["max_position_embeddings"]
    plan = make_plan(config)
    assert plan.context == 32768 and "default" in plan.context_source


def test_kv_that_cannot_hold_one_sequence_does_not_fit():
    code, text = run(str(FLASH), gpu_mem_gib=60)  # 55.8 GiB weights + 4 reserve
    assert code == 1 and "does not fit" in text and "INFERENCE_BACKEND=openai" in text


def test_unplannable_configs_exit_2(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    assert main(["plan", "--config", str(bad)]) == 2
    assert "model_type 'llama'" in capsys.readouterr().err
    assert run(str(tmp_path / "missing.json"))[0] == 2


def test_the_remote_backend_hint_names_a_real_section_of_deploy_md():
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert "## 6. Remote inference" in deploy and "INFERENCE_BACKEND=openai" in deploy
    assert '"Remote inference"' in REMOTE_HINT


def test_configs_ship_as_package_data():
    names = {p.name for p in CONFIGS_DIR.glob("*.json")}
    assert {"glm-4.5-air.json", "glm-4.7-flash.json", "glm-5.json", "glm-4.7.json"} <= names
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "*.json" in data["package-data"]["inference.configs"]
