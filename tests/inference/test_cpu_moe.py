"""The compiled MoE experts (`wecom_moe_experts`, installed as `CpuMoE`) give the torch experts'
numbers for fp32 and int8 weights, a few rows an expert or many, and follow weight changes."""

import pytest
import torch

from inference.config import ModelConfig
from inference.layers.linear import quantize_linears_
from inference.layers.moe import MoE
from inference.models import cpu_fast_path, cpu_moe

pytestmark = pytest.mark.usefixtures("cpu_kernels_built")

# hidden 40 and intermediate 24: not multiples of the kernels' 16 or 64 lanes
CONFIG = dict(model_type="glm4_moe", vocab_size=64, hidden_size=40, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=20, moe_intermediate_size=24,
              n_routed_experts=12, num_experts_per_tok=4, n_group=3, topk_group=2, first_k_dense_replace=1,
              n_shared_experts=1, routed_scaling_factor=1.5)


def pair(int8: bool = False) -> tuple[MoE, MoE]:
    """The same random experts twice: torch's, and with the fast path installed."""
    torch.manual_seed(0)
    config = ModelConfig.from_dict(CONFIG)
    plain = MoE(config)
    for p in plain.parameters():
        torch.nn.init.normal_(p, std=0.3)
    fused = MoE(config)
    fused.load_state_dict(plain.state_dict())
    if int8:
        quantize_linears_(plain), quantize_linears_(fused)
    cpu_fast_path.install_(fused)
    assert type(fused) is cpu_fast_path.CpuMoE
    return plain.eval(), fused.eval()


def calls(monkeypatch) -> list[int]:
    seen = []
    real = cpu_moe.run

    def counting(made, counts, rows, weights):
        seen.append(int(counts.max()))
        return real(made, counts, rows, weights)

    monkeypatch.setattr(cpu_moe, "run", counting)
    return seen


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
@pytest.mark.parametrize("tokens", [1, 3, 16, 40])
def test_compiled_experts_equal_the_torch_experts(tokens, int8, monkeypatch):
    plain, fused = pair(int8)
    seen = calls(monkeypatch)
    x = torch.randn(tokens, 40)
    with torch.inference_mode():
        expected, got = plain(x), fused(x)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    if tokens <= cpu_moe.MAX_ROWS:  # a token takes an expert once: no expert has more rows
        assert len(seen) == 1


def test_many_rows_an_expert_take_torchs_products(monkeypatch):
    plain, fused = pair()
    seen = calls(monkeypatch)
    x = torch.randn(100, 40)
    with torch.inference_mode():
        torch.testing.assert_close(fused(x), plain(x), atol=2e-5, rtol=1e-4)
    assert seen == []


def test_the_plan_follows_a_changed_weight():
    plain, fused = pair()
    x = torch.randn(2, 40)
    with torch.inference_mode():
        before = fused(x)
    with torch.no_grad():
        for moe in (plain, fused):
            moe.experts[int(moe.gate(x)[1][0, 0])].down_proj.weight.mul_(-2)
    with torch.inference_mode():
        after, expected = fused(x), plain(x)
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, expected, atol=2e-5, rtol=1e-4)


def test_autograd_and_other_dtypes_run_the_torch_experts(monkeypatch):
    plain, fused = pair()
    seen = calls(monkeypatch)
    x = torch.randn(3, 40)
    torch.testing.assert_close(fused(x), plain(x), atol=2e-5, rtol=1e-4)  # autograd on
    with torch.inference_mode():
        fused.to(torch.bfloat16)(x.bfloat16())
    assert seen == []
