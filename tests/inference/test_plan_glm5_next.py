"""`python -m inference plan` for GLM-5.3-Flash (`glm5_next`, inference/plan_glm5_next.py): the
tensors it counts are transformers' text model's, the cache a token and the state a sequence are
what the engine's layout allocates, and the state does not grow with the context."""

import json
from pathlib import Path

import pytest
import torch
from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

from inference.config import ModelConfig
from inference.layers.caches.layouts import cache_layout
from inference.plan import run
from inference.plan_glm5_next import make_plan
from tests.inference.test_glm5_next import VISION, text_config

FLASH = Path(__file__).resolve().parents[2] / "inference" / "configs" / "glm-5.3-flash.json"


@pytest.mark.parametrize("overrides", [{}, {"tie_word_embeddings": True, "indexer_types": ["full"] * 3 + ["shared"],
                                            "layer_types": ["linear_attention", "linear_attention",
                                                            "indexed_attention", "indexed_attention"]}])
def test_parameters_are_transformers_text_model(overrides, tmp_path):
    tie = overrides.pop("tie_word_embeddings", False)
    config = Glm5NextConfig(text_config=text_config(**overrides), vision_config=VISION, tie_word_embeddings=tie)
    hf = Glm5NextForConditionalGeneration(config)
    text = sum(t.numel() for t in hf.model.language_model.state_dict().values())  # the router biases too
    text += 0 if tie else hf.lm_head.weight.numel()
    raw = json.loads(config.to_json_string())
    assert make_plan(raw, "bf16", 141.0, 4096, 4.0).params == text


def test_cache_and_state_are_the_layouts(tmp_path):
    raw = json.loads(Glm5NextConfig(text_config=text_config(), vision_config=VISION).to_json_string())
    plan = make_plan(raw, "bf16", 141.0, 4096, 4.0)
    layout = cache_layout(ModelConfig.from_dict(raw))
    assert plan.per_token == layout.bytes_per_token(torch.bfloat16)
    assert plan.per_sequence == layout.bytes_per_sequence()


def test_the_published_config_plans_and_the_state_is_flat():
    raw = json.loads(FLASH.read_text())
    plan = make_plan(raw, "fp8", 141.0, 32768, 4.0)
    assert (plan.kda_layers, plan.sparse_layers) == (34, 11)
    # 34 KDA layers x (64 x 128 x 128 + 3 x 64 x 128 x 3) fp32; 11 x (512 + 2 x 128) bf16 a token
    assert plan.per_sequence == 34 * (64 * 128 * 128 + 3 * 64 * 128 * 3) * 4
    assert plan.per_token == 11 * (512 + 256) * 2
    assert plan.sequence_bytes(32768) - plan.sequence_bytes(4096) == (32768 - 4096) * plan.per_token
    code, text = run(str(FLASH), "fp8", 141.0, 32768, 4.0)
    assert code == 1 and "state a sequence" in text and "does not fit" in text  # 293 GiB of fp8 weights
    code, text = run(str(FLASH), "fp8", 1000.0, 32768, 4.0)
    assert code == 0 and "fits:" in text
