"""Runs the CUDA W8A16 kernel under Triton's interpreter and prints what it computed, as JSON.

A script of its own, started by test_w8a16_triton.py: Triton must see TRITON_INTERPRET=1
before it is first imported, which a test process that imported it already cannot arrange.
"""

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"

import torch  # noqa: E402

from inference.layers.kernels import w8a16_triton  # noqa: E402
from inference.layers.linear import Int8Linear, quantize_weight  # noqa: E402

SHAPES = [(1, 50, 70), (3, 130, 300), (16, 64, 128), (17, 33, 65), (64, 96, 200)]
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return ((out.double() - expected).abs().max() / expected.abs().max()).item()


def cases() -> list[dict]:
    results = []
    for rows, out_features, in_features in SHAPES:
        for name, dtype in DTYPES.items():
            gen = torch.Generator().manual_seed(rows * 1000 + out_features)
            weight, scales = quantize_weight(torch.randn(out_features, in_features, generator=gen))
            scales = scales.to(dtype)
            x = torch.randn(rows, in_features, generator=gen).to(dtype)
            bias = torch.randn(out_features, generator=gen).to(dtype)
            reference = x.double() @ (weight.double() * scales.double()[:, None]).t()
            for with_bias in (False, True):
                out = w8a16_triton.matmul(x, weight, scales, bias if with_bias else None)
                expected = reference + bias.double() if with_bias else reference
                results.append({"shape": [rows, out_features, in_features], "dtype": name,
                                "bias": with_bias, "out_dtype": str(out.dtype).split(".")[-1],
                                "out_shape": list(out.shape), "error": relative_error(out, expected)})
    return results


def against_the_cpu_kernel() -> float:
    torch.manual_seed(0)
    int8 = Int8Linear.from_linear(torch.nn.Linear(96, 40, bias=True))
    x = torch.randn(5, 96)
    return relative_error(w8a16_triton.matmul(x, int8.weight, int8.scales.float(), int8.bias),
                          int8(x).double())  # aten._weight_int8pack_mm (bf16 activations)


def shape_errors() -> list[str]:
    weight, scales = quantize_weight(torch.randn(8, 16))
    messages = []
    for x, s in ((torch.randn(2, 12), scales), (torch.randn(2, 16), scales[:4])):
        try:
            w8a16_triton.matmul(x, weight, s)
            messages.append("")
        except ValueError as exc:
            messages.append(str(exc))
    return messages


if __name__ == "__main__":
    json.dump({"cases": cases(), "cpu_kernel_error": against_the_cpu_kernel(),
               "shape_errors": shape_errors()}, sys.stdout)
