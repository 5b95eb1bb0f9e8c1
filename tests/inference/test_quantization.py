"""W8A16: int8 weight-only linear layers, at load time or from an int8 checkpoint."""

import torch

from inference.config import ModelConfig
from inference.layers.linear import Int8Linear, Linear, quantize_linears_, quantize_weight
from inference.llm import LLM
from inference.quantize import quantize_checkpoint
from tests.inference.helpers import glm5_config, write_checkpoint


def _logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    cache = llm.model.new_cache()
    with torch.inference_mode():
        hidden = llm.model(torch.tensor(ids), torch.arange(len(ids)), cache)
        return llm.model.compute_logits(hidden).float()


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


def _raw():
    return glm5_config(hidden_size=64, intermediate_size=128, head_dim=16, num_hidden_layers=2)


def test_quantize_weight_round_trips_within_half_a_step():
    w = torch.randn(48, 64)
    q, scales = quantize_weight(w)
    assert q.dtype == torch.int8 and scales.shape == (48,)
    assert ((q.float() * scales[:, None] - w).abs() <= scales[:, None] / 2 + 1e-6).all()


def test_int8_linear_matches_dense():
    linear = Linear(64, 96, bias=True)
    torch.nn.init.normal_(linear.bias)
    x = torch.randn(5, 64)
    int8 = Int8Linear.from_linear(linear)
    assert _relative_error(int8(x), linear(x)) < 1e-2
    assert int8(x.to(torch.bfloat16)).dtype == torch.bfloat16


def test_load_time_w8a16_logits_close_to_fp32(tmp_path):
    path = write_checkpoint(tmp_path / "m", _raw())
    dense = LLM.from_pretrained(path, kv_cache_bytes=1 << 24)
    int8 = LLM.from_pretrained(path, quantization="w8a16", kv_cache_bytes=1 << 24)
    assert any(isinstance(m, Int8Linear) for m in int8.model.modules())
    assert not any(type(m) is Linear for m in int8.model.modules())
    ids = torch.randint(0, 128, (40,)).tolist()
    assert _relative_error(_logits(int8, ids), _logits(dense, ids)) < 1e-2


def test_int8_checkpoint_loads_to_the_same_model(tmp_path):
    path = write_checkpoint(tmp_path / "m", _raw())
    out = quantize_checkpoint(path, tmp_path / "q")
    assert ModelConfig.from_pretrained(out).quantization == "w8a16"
    from_checkpoint = LLM.from_pretrained(out, kv_cache_bytes=1 << 24)
    at_load = LLM.from_pretrained(path, quantization="w8a16", kv_cache_bytes=1 << 24)
    ids = torch.randint(0, 128, (24,)).tolist()
    torch.testing.assert_close(
        _logits(from_checkpoint, ids), _logits(at_load, ids), atol=2e-2, rtol=2e-2
    )
    assert (
        _relative_error(_logits(from_checkpoint, ids), _logits(LLM.from_pretrained(path, kv_cache_bytes=1 << 24), ids))
        < 1e-2
    )
    assert (out / "model.safetensors").stat().st_size < 0.7 * (
        path / "model.safetensors"
    ).stat().st_size


def test_int8_weight_bytes_about_half_of_bf16():
    config = ModelConfig.from_dict(
        glm5_config(hidden_size=256, intermediate_size=512, head_dim=32, dtype="bfloat16")
    )
    from inference.models import MODELS

    model = MODELS["glm5_sparse"](config).to(torch.bfloat16)
    dense = sum(
        m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, Linear)
    )
    quantize_linears_(model)
    int8 = sum(
        m.weight.numel() * m.weight.element_size() + m.scales.numel() * m.scales.element_size()
        for m in model.modules()
        if isinstance(m, Int8Linear)
    )
    assert 0.49 < int8 / dense < 0.55
