"""The fused one-row CPU decode layer gives the torch layers' numbers, in every model and cache
mode, and steps aside where it does not apply."""

import pytest
import torch

from inference.config import ModelConfig
from inference.engine import EngineArgs, LLMEngine
from inference.layers import linear
from inference.layers.caches.layouts import cache_layout
from inference.layers.kernels import cpu_kernels
from inference.layers.linear import quantize_linears_
from inference.loader import load_model
from inference.models import cpu_decode, cpu_step
from inference.sampling_params import SamplingParams
from tests.inference.helpers import glm5_config, reference_tokens, write_checkpoint

pytestmark = pytest.mark.usefixtures("cpu_kernels_built")

N = 41  # crosses two windows of 16 and ten blocks of 4
MODES = {
    "glm5-routed": {},
    "glm5-union": {"routed": False},
    "glm5-routed-bias": {"attention_bias": True},
    "glm4-sparse": {"model_type": "glm4", "num_mtp_heads": 0, "attention_bias": True},
    "glm4-dense": {"model_type": "glm4", "sliding_window": None, "global_interval": None, "num_mtp_heads": 0},
}


def load(tmp_path, **overrides):
    """Loaded as a checkpoint is: input-major fp32 weights, which the fused path needs."""
    torch.manual_seed(0)
    raw = glm5_config(**overrides)
    return load_model(write_checkpoint(tmp_path, raw), ModelConfig.from_dict(raw), "cpu")


@pytest.fixture
def fused_calls(monkeypatch):
    """How many layer calls took a fused path: one layer at a time (`cpu_decode.forward`), or all
    of a model's layers in one call (`cpu_step.step`, one entry per layer)."""
    calls = []
    real, real_step = cpu_decode.forward, cpu_step.step

    def counting(*args):
        calls.append("layer")
        return real(*args)

    def counting_step(model, *args):
        out = real_step(model, *args)
        if out is not None:
            calls.extend(["model"] * len(model.model.layers))
        return out

    monkeypatch.setattr(cpu_decode, "forward", counting)
    monkeypatch.setattr(cpu_step, "step", counting_step)
    return calls


def decode(model, ids, fused: bool, monkeypatch, chunks=None) -> torch.Tensor:
    """Prefill 3 tokens, then one at a time (or in `chunks`); the logits of every position."""
    chunks = chunks or [3] + [1] * (len(ids) - 3)
    with monkeypatch.context() as patch:
        if not fused:
            patch.setattr(cpu_decode, "layer_plan", lambda layer: None)  # the torch layers
        with torch.inference_mode():
            cache, out, a = model.new_cache(), [], 0
            for size in chunks:
                out.append(model.compute_logits(model(ids[a : a + size], torch.arange(a, a + size), cache)))
                a += size
    return torch.cat(out)


@pytest.mark.parametrize("overrides", MODES.values(), ids=MODES.keys())
def test_fused_decode_equals_the_torch_layers(tmp_path, monkeypatch, fused_calls, overrides):
    model = load(tmp_path, **overrides)
    ids = torch.randint(0, 128, (N,), generator=torch.Generator().manual_seed(1))
    torch_logits = decode(model, ids, False, monkeypatch)
    assert not fused_calls
    fused_logits = decode(model, ids, True, monkeypatch)
    assert len(fused_calls) == (N - 2) * model.config.num_hidden_layers  # the 3-row prefill too
    torch.testing.assert_close(fused_logits, torch_logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides", [MODES["glm5-routed"], MODES["glm4-sparse"]], ids=["glm5-routed", "glm4-sparse"])
def test_chunks_of_a_few_rows_take_it_too_and_agree(tmp_path, monkeypatch, fused_calls, overrides):
    """Speculative verifies and small batches: up to MAX_ROWS rows at once; a longer chunk is a
    prefill and runs the torch layers."""
    model = load(tmp_path, **overrides)
    chunks = [3, 5, 1, 9, cpu_decode.MAX_ROWS, cpu_decode.MAX_ROWS + 1, 2, 4]  # 57: 3+ windows
    ids = torch.randint(0, 128, (sum(chunks),), generator=torch.Generator().manual_seed(4))
    torch_logits = decode(model, ids, False, monkeypatch, chunks)
    fused_logits = decode(model, ids, True, monkeypatch, chunks)
    assert len(fused_calls) == (len(chunks) - 1) * model.config.num_hidden_layers  # all but the 17
    torch.testing.assert_close(fused_logits, torch_logits, atol=1e-5, rtol=1e-5)


def test_the_mtp_block_takes_it_too_and_agrees(tmp_path, monkeypatch, fused_calls):
    model = load(tmp_path)
    hidden, nxt = torch.randn(1, 32), torch.tensor([5])
    results = []
    for fused in (False, True):
        with monkeypatch.context() as patch:
            if not fused:
                patch.setattr(cpu_decode, "layer_plan", lambda layer: None)  # the torch layers
            with torch.inference_mode():
                results.append(model.mtp_forward(0, hidden, nxt, torch.tensor([0]), model.new_cache()))
    assert len(fused_calls) == 1
    torch.testing.assert_close(results[1], results[0], atol=1e-5, rtol=1e-5)


def test_weight_changes_are_followed(tmp_path, monkeypatch, fused_calls):
    model = load(tmp_path, model_type="glm4", num_mtp_heads=0)
    ids = torch.randint(0, 128, (12,), generator=torch.Generator().manual_seed(2))
    decode(model, ids, True, monkeypatch)
    layer = model.model.layers[1]
    with torch.no_grad():  # in place: same storage, new version (the copies are remade)
        layer.mlp.down_proj.weight.mul_(1.5)
        layer.self_attn.qkv_proj.weight.add_(0.01)
        layer.post_mlp_layernorm.weight.mul_(0.5)  # read in place by the kernel
    layer.post_attention_layernorm.weight = torch.nn.Parameter(torch.rand(32) + 0.5)  # replaced
    torch.testing.assert_close(decode(model, ids, True, monkeypatch), decode(model, ids, False, monkeypatch),
                               atol=1e-5, rtol=1e-5)
    assert fused_calls


def _scaled(t: torch.Tensor) -> torch.Tensor:
    """`t` changed, in its own memory layout (input-major weights stay input-major)."""
    return t.detach().t().mul(1.5).add(0.01).t() if t.dim() == 2 else t.detach().mul(1.5).add(0.01)


def _some_parameters(model) -> list[torch.nn.Parameter]:
    """A weight and a bias of each kind: read in place by the kernels, read through copies."""
    layer = model.model.layers[1]
    return [layer.mlp.down_proj.weight, layer.self_attn.qkv_proj.weight, layer.self_attn.qkv_proj.bias,
            layer.post_mlp_layernorm.weight, model.model.embed_tokens.weight, model.model.norm.weight]


def test_weights_given_new_data_are_followed(tmp_path, monkeypatch, fused_calls):
    """`param.data = t` keeps the parameter object and its version; where the data lives moves.
    Both paths follow it, as they follow the same change made in place (a twin model): the
    compiled one (plans) and the torch layers on MKL (a cached transposed view of the weight)."""
    monkeypatch.setattr(linear, "FP32_MATMUL", "mkl")  # the torch layers' linears all on MKL
    model, twin = (load(tmp_path / name, model_type="glm4", num_mtp_heads=0) for name in ("model", "twin"))
    ids = torch.randint(0, 128, (12,), generator=torch.Generator().manual_seed(2))
    decode(model, ids, True, monkeypatch)
    decode(model, ids, False, monkeypatch)
    for p in _some_parameters(model):
        p.data = _scaled(p)
    with torch.no_grad():
        for p in _some_parameters(twin):
            p.copy_(_scaled(p))
    expected = decode(twin, ids, False, monkeypatch)  # its first call: nothing cached before the change
    torch.testing.assert_close(decode(model, ids, False, monkeypatch), expected, atol=1e-5, rtol=1e-5)
    fused_calls.clear()
    torch.testing.assert_close(decode(model, ids, True, monkeypatch), expected, atol=1e-5, rtol=1e-5)
    assert fused_calls


def test_an_attention_bias_changed_in_place_is_followed_in_routed_mode(tmp_path, monkeypatch, fused_calls):
    """Routed: q/k/v and the router run as one fused copy, which must follow the bias too."""
    model, twin = (load(tmp_path / name, attention_bias=True) for name in ("model", "twin"))
    ids = torch.randint(0, 128, (12,), generator=torch.Generator().manual_seed(2))
    decode(model, ids, True, monkeypatch)
    decode(model, ids, False, monkeypatch)
    for m in (model, twin):
        with torch.no_grad():
            m.model.layers[0].self_attn.qkv_proj.bias.add_(0.5)
    expected = decode(twin, ids, False, monkeypatch)  # its first call: nothing cached before the change
    torch.testing.assert_close(decode(model, ids, True, monkeypatch), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(decode(model, ids, False, monkeypatch), expected, atol=1e-5, rtol=1e-5)


def test_the_paged_engine_gives_the_torch_layers_tokens_alone_and_batched(tmp_path, monkeypatch, fused_calls):
    model = load(tmp_path)
    model.lm_head.weight.data *= 8  # no near-ties that rounding between paths could flip
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (23, 5, 40, 11)]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    per_block = cache_layout(model.config).bytes_per_block(64, torch.float32)
    engine = LLMEngine(model, args=EngineArgs(kv_cache_bytes=32 * per_block), eos_token_ids=[])
    alone = engine.generate(prompts[:1], params)[0].token_ids
    batched = [o.token_ids for o in engine.generate(prompts, params)]
    assert fused_calls
    with monkeypatch.context() as patch:
        patch.setattr(cpu_decode, "layer_plan", lambda layer: None)  # the torch layers
        plain = [reference_tokens(model, p, params) for p in prompts]
    assert alone == plain[0]
    assert batched == plain


def test_it_steps_aside_where_it_does_not_apply(tmp_path):
    model = load(tmp_path)
    layer = model.model.layers[0]
    row = torch.randn(1, 32)
    with torch.inference_mode():
        assert cpu_decode.plan(layer, row) is not None
        assert cpu_decode.plan(layer, torch.randn(cpu_decode.MAX_ROWS, 32)) is not None
        assert cpu_decode.plan(layer, torch.randn(cpu_decode.MAX_ROWS + 1, 32)) is None  # a prefill
        assert cpu_decode.plan(layer, row.to(torch.bfloat16)) is None
    assert cpu_decode.plan(layer, row) is None  # autograd on
    layer.router = linear.Int8Linear.from_linear(layer.router)  # an int8 router beside fp32 q/k/v
    with torch.inference_mode():
        assert cpu_decode.plan(layer, row) is None


@pytest.mark.parametrize("overrides", MODES.values(), ids=MODES.keys())
def test_int8_layers_take_the_fused_path_and_equal_the_torch_layers(tmp_path, monkeypatch, fused_calls, overrides):
    """W8A16 layers (the routed ones with their fused int8 q/k/v+router) run the same compiled
    layer with the int8 product, token by token and in verify-sized chunks, and follow a change
    of their scales."""
    model, twin = (quantize_linears_(load(tmp_path / name, **overrides)) for name in ("model", "twin"))
    ids = torch.randint(0, 128, (N,), generator=torch.Generator().manual_seed(9))
    for chunks in (None, [3, 5, 1, 4, 1, 1, 6, 2, 1, 9, 1, 3, 4]):
        torch_logits = decode(model, ids, False, monkeypatch, chunks)
        fused_calls.clear()
        torch.testing.assert_close(decode(model, ids, True, monkeypatch, chunks), torch_logits, atol=1e-4, rtol=1e-4)
        assert len(fused_calls) == len(chunks or [3] + [1] * (N - 3)) * model.config.num_hidden_layers
    for m in (model, twin):
        with torch.no_grad():
            m.model.layers[1].mlp.down_proj.scales.mul_(1.5)
            m.model.layers[0].self_attn.qkv_proj.scales.mul_(0.5)
    expected = decode(twin, ids, False, monkeypatch)  # its first call: nothing cached before the change
    torch.testing.assert_close(decode(model, ids, True, monkeypatch), expected, atol=1e-4, rtol=1e-4)


def test_a_model_built_in_code_reads_its_weights_in_place(monkeypatch, fused_calls):
    """Weights as nn.Linear makes them (output-major): no copies, the same numbers."""
    from tests.inference.test_kv_cache import build

    torch.manual_seed(0)
    model = build(model_type="glm4", num_mtp_heads=0)
    ids = torch.randint(0, 128, (N,), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(decode(model, ids, True, monkeypatch), decode(model, ids, False, monkeypatch),
                               atol=1e-5, rtol=1e-5)
    assert fused_calls
    layer = model.model.layers[0]
    assert cpu_decode.plan(layer, torch.randn(1, 32)) is None  # autograd on
    with torch.inference_mode():
        plan = cpu_decode.plan(layer, torch.randn(1, 32))
    assert plan.tensors[1].data_ptr() == layer.self_attn.o_proj.weight.data_ptr()  # not a copy


def test_shapes_the_kernels_cannot_take_get_the_torch_layers_and_their_errors(tmp_path):
    model = load(tmp_path, model_type="glm4", num_mtp_heads=0)
    layer = model.model.layers[0]
    with torch.inference_mode():
        assert cpu_decode.plan(layer, torch.randn(1, 31)) is None  # a row of the wrong width
        with pytest.raises(RuntimeError):  # torch's own error, not a read past the weight
            layer(torch.randn(1, 31), model.rotary.rotations(torch.tensor([0])), model.new_cache().layers[0])
        plan = cpu_decode.plan(layer, torch.randn(1, 32))
        with pytest.raises(ValueError, match="rotations"):
            cpu_decode.forward(layer, plan, torch.randn(1, 32), model.rotary.rotations(torch.tensor([0, 1])),
                               model.new_cache().layers[0])
    with pytest.raises(ValueError, match="bias"):
        cpu_kernels.matmul(torch.randn(1, 8), torch.randn(4, 8), torch.randn(5))


def test_a_router_given_to_a_layer_without_one_remakes_the_plan(tmp_path):
    model = load(tmp_path, routed=False)
    layer = model.model.layers[0]
    row = torch.randn(1, 32)
    with torch.inference_mode():
        first = cpu_decode.plan(layer, row)
    layer.router = torch.nn.Linear(32, 3)  # a plain nn.Linear: the torch layers now
    with torch.inference_mode():
        assert cpu_decode.plan(layer, row) is None
    assert first is not None
