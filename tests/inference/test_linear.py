"""The CPU inference paths of `Linear` (input-major fp32 weights, the measured choice of fp32
kernel) and the fused qkv+router projection."""

import copy
import time

import pytest
import torch
import torch.nn.functional as F

from inference.config import ModelConfig
from inference.layers import linear
from inference.layers.linear import Linear, input_major
from inference.loader import load_model
from inference.models.glm5_sparse import DecoderLayer
from tests.inference.helpers import glm5_config, write_checkpoint


def test_input_major_inference_matches_f_linear_and_follows_weight_changes():
    torch.manual_seed(0)
    layer = Linear(32, 48, bias=True)
    x = torch.randn(5, 32)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        layer.weight.mul_(3)  # in place: the version changes, the input-major copy is remade
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-4, rtol=1e-5)
    layer.weight = torch.nn.Parameter(torch.randn(48, 32))  # replaced: new storage
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)


def test_a_used_layer_can_be_copied_and_still_trains():
    layer = Linear(16, 8)
    x = torch.randn(2, 16)
    with torch.inference_mode():
        expected = layer(x)
    copied = copy.deepcopy(layer)
    with torch.inference_mode():
        torch.testing.assert_close(copied(x), expected)
    layer(x).sum().backward()  # autograd on: the plain F.linear, gradients flow
    assert layer.weight.grad is not None


def test_routed_layer_fused_projection_equals_separate_matmuls():
    torch.manual_seed(0)
    layer = DecoderLayer(ModelConfig.from_dict(glm5_config(routed=True))).eval()
    x = torch.randn(3, layer.self_attn.qkv_proj.in_features)
    with torch.inference_mode():
        qkv, gate = layer.qkv_and_gate(x)
        torch.testing.assert_close(qkv, F.linear(x, layer.self_attn.qkv_proj.weight), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(gate, layer.gate(x, F.linear(x, layer.router.weight)), atol=1e-6, rtol=1e-5)


def test_loaded_linear_weights_are_input_major_without_a_second_copy(tmp_path):
    raw = glm5_config()
    model = load_model(write_checkpoint(tmp_path, raw), ModelConfig.from_dict(raw), "cpu")
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.t().is_contiguous() for m in linears)
    x = torch.randn(3, linears[0].in_features)
    with torch.inference_mode():
        torch.testing.assert_close(linears[0](x), x @ linears[0].weight.t())
    assert all(m._copy is None for m in linears)  # read in place: no input-major copy was made


@pytest.mark.parametrize("kernel", ["mkl", "onednn"])
def test_each_fp32_kernel_matches_f_linear_at_every_row_bucket(monkeypatch, kernel):
    monkeypatch.setattr(linear, "FP32_MATMUL", kernel)
    torch.manual_seed(0)
    layer = Linear(64, 96, bias=True)
    layer.weight = torch.nn.Parameter(input_major(layer.weight.detach()))
    with torch.inference_mode():
        for rows in (1, 3, 20, 100):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
        x3 = torch.randn(2, 3, 64)  # leading dimensions are flattened and restored
        torch.testing.assert_close(layer(x3), F.linear(x3, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
    assert all(call.__name__ == kernel for call in layer._fp32._calls)


def test_packed_onednn_copy_follows_in_place_weight_changes(monkeypatch):
    monkeypatch.setattr(linear, "FP32_MATMUL", "onednn")
    layer = Linear(32, 16)
    layer.weight = torch.nn.Parameter(input_major(layer.weight.detach()))
    x = torch.randn(4, 32)
    with torch.inference_mode():
        before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)  # same storage, new version: the packed copy is remade
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), 2 * before, atol=1e-5, rtol=1e-5)


def test_auto_measures_once_per_shape_and_bucket_and_keeps_no_unused_copy(monkeypatch):
    monkeypatch.setattr(linear, "_CHOICES", {})
    monkeypatch.setattr(linear.cpu_kernels, "available", lambda: False)  # one row measured too
    measured = []

    def pick_mkl(kernels, x):
        measured.append(x.shape[0])
        return "mkl"

    monkeypatch.setattr(linear, "_faster", pick_mkl)
    layers = [Linear(32, 16) for _ in range(2)]
    for layer in layers:
        layer.weight = torch.nn.Parameter(input_major(layer.weight.detach()))
    with torch.inference_mode():
        for layer in layers:  # same shape: the second layer reuses the first one's choices
            for rows in (1, 1, 5, 7, 30):
                layer(torch.randn(rows, 32))
    assert measured == [1, 5, 30]
    assert set(linear._CHOICES) == {((16, 32), False, 0), ((16, 32), False, 1), ((16, 32), False, 2)}
    assert all(layer._fp32._packed is None for layer in layers)


def test_faster_names_the_kernel_that_ran_fastest():
    x = torch.randn(2, 8)

    def slow(x):
        time.sleep(1e-3)

    assert linear._faster({"slow": slow, "fast": lambda x: None}, x) == "fast"


def test_packed_copies_stop_at_the_byte_cap_and_the_rest_stay_on_mkl(monkeypatch):
    monkeypatch.setattr(linear, "FP32_MATMUL", "onednn")
    layers = [Linear(32, 16) for _ in range(3)]
    for layer in layers:
        layer.weight = torch.nn.Parameter(input_major(layer.weight.detach()))
    one = 32 * 16 * 4
    monkeypatch.setattr(linear, "FP32_PACKED_MAX_BYTES", linear.packed_bytes() + 2 * one)
    x = torch.randn(3, 32)
    with torch.inference_mode():
        outs = [layer(x) for layer in layers]
    assert [layer._fp32._calls[1].__name__ for layer in layers] == ["onednn", "onednn", "mkl"]
    assert layers[2]._fp32._packed is None
    for layer, out in zip(layers, outs, strict=True):
        torch.testing.assert_close(out, F.linear(x, layer.weight), atol=1e-5, rtol=1e-5)
