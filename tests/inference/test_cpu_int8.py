"""The compiled int8 (W8A16) product on CPU: the dequantized product's numbers for any shape, on
both code paths, the same bits for a row whatever is beside it, and `Int8Linear` handing it its
fp32 rows (its fp32 scales and bias following changes)."""

import ctypes

import pytest
import torch

from inference.layers import linear
from inference.layers.kernels import cpu_kernels
from inference.layers.linear import Int8Linear, quantize_weight

pytestmark = pytest.mark.usefixtures("cpu_kernels_built")


def _reference(x, q, scales, bias):
    """What the product means: the dequantized weight, in float64."""
    out = x.double() @ (q.double() * scales.double()[:, None]).T
    return (out if bias is None else out + bias.double()).float()


def _quantized(n, k, seed):
    gen = torch.Generator().manual_seed(seed)
    q, scales = quantize_weight(torch.randn(n, k, generator=gen))
    return q, scales.float().contiguous(), torch.randn(n, generator=gen), gen


@pytest.mark.parametrize("n, k", [(1, 1), (3, 5), (4, 16), (7, 17), (64, 768), (1029, 771), (96, 2304), (5, 100)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 9, 16])
def test_matmul_int8_matches_the_dequantized_product(n, k, bias, rows):
    """K with and without a 64-wide body and a 16-wide tail, output rows of every group size."""
    q, scales, b, gen = _quantized(n, k, n * 1000 + k)
    x = torch.randn(rows, k, generator=gen)
    out = cpu_kernels.matmul_int8(x, q, scales, b if bias else None)
    torch.testing.assert_close(out, _reference(x, q, scales, b if bias else None), atol=1e-4, rtol=1e-4)


def test_the_portable_loop_matches_too(tmp_path):
    portable = cpu_kernels.declare(ctypes.CDLL(str(cpu_kernels.build(cpu_kernels._compiler(), tmp_path, ("-DWECOM_GEMV_PORTABLE",)))))
    for n, k in ((1, 1), (5, 7), (1029, 771), (64, 2304)):
        q, scales, b, gen = _quantized(n, k, n + k)
        x = torch.randn(3, k, generator=gen)
        torch.testing.assert_close(cpu_kernels.matmul_int8(x, q, scales, b, lib=portable), _reference(x, q, scales, b),
                                   atol=1e-4, rtol=1e-4)


def test_a_row_gets_the_same_bits_whatever_the_threads_and_rows_beside_it():
    q, scales, _, gen = _quantized(1031, 300, 0)
    x = torch.randn(1, 300, generator=gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_kernels.matmul_int8(x, q, scales)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(cpu_kernels.matmul_int8(x, q, scales), one)
    beside = cpu_kernels.matmul_int8(torch.cat((torch.randn(2, 300), x, torch.randn(3, 300))), q, scales)
    assert torch.equal(beside[2:3], one)


def test_shapes_that_do_not_fit_are_refused_with_a_clear_error():
    q, scales, b, _ = _quantized(8, 16, 1)
    with pytest.raises(ValueError, match="rows of 16 features"):
        cpu_kernels.matmul_int8(torch.randn(2, 15), q, scales)
    with pytest.raises(ValueError, match="for 8 outputs"):
        cpu_kernels.matmul_int8(torch.randn(2, 16), q, scales[:7].contiguous())


def test_int8_linear_sends_few_fp32_rows_to_the_kernel_and_follows_its_scales_and_bias(monkeypatch):
    """40 input features: torch's own CPU int8 matmul (which the other rows would take) reads
    past a K that is not a multiple of 16, so those rows dequantize instead."""
    calls = []
    real = cpu_kernels.matmul_int8
    monkeypatch.setattr(cpu_kernels, "matmul_int8", lambda x, *a: calls.append(x.shape[0]) or real(x, *a))
    dense = torch.nn.Linear(40, 24)
    layer = Int8Linear.from_linear(dense)
    assert layer.scales.dtype == torch.bfloat16  # as CPU checkpoints keep them; the kernel reads fp32 copies
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(linear.INT8_KERNEL_ROWS, 40, generator=gen)
    with torch.inference_mode():
        out = layer(x)
        torch.testing.assert_close(out, _reference(x, layer.weight, layer.scales.float(), layer.bias), atol=1e-4, rtol=1e-4)
        assert calls == [linear.INT8_KERNEL_ROWS]
        more = torch.randn(linear.INT8_KERNEL_ROWS + 1, 40, generator=gen)  # past the kernel's rows: torch's
        torch.testing.assert_close(layer(more), _reference(more, layer.weight, layer.scales.float(), layer.bias),
                                   atol=1e-4, rtol=1e-4)
        half = layer(x.to(torch.bfloat16))  # bf16 rows: torch's
        torch.testing.assert_close(half.float(), out, atol=0.1, rtol=0.05)
        assert calls == [linear.INT8_KERNEL_ROWS]
    layer.scales.mul_(2)  # in place, outside inference mode: a new version
    layer.bias.add_(1)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x[:1]), _reference(x[:1], layer.weight, layer.scales.float(), layer.bias),
                                   atol=1e-4, rtol=1e-4)
    layer.bias = None
    with torch.inference_mode():
        torch.testing.assert_close(layer(x[:1]), _reference(x[:1], layer.weight, layer.scales.float(), None),
                                   atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rows", [1, 17])
@pytest.mark.parametrize("k", [24, 100])
def test_bf16_rows_with_odd_input_features_are_right_and_do_not_crash(rows, k):
    q, scales, b, gen = _quantized(24, k, k)
    layer = Int8Linear(q, scales.to(torch.bfloat16), b)
    x = torch.randn(rows, k, generator=gen)
    with torch.inference_mode():
        out = layer(x.to(torch.bfloat16)).float()
    torch.testing.assert_close(out, _reference(x, q, scales.to(torch.bfloat16).float(), b), atol=0.5, rtol=0.05)
