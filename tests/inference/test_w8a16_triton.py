"""The CUDA W8A16 kernel (inference/layers/kernels/w8a16_triton.py), run here by Triton's interpreter:
the same program the GPU compiles, against the dequantized matmul in float64."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference.layers.kernels import w8a16_triton

pytest.importorskip("triton")  # a dev dependency; torch's CUDA wheels bring it too

TOLERANCE = {"bfloat16": 1e-2, "float16": 1e-3, "float32": 1e-5}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def interpreted() -> dict:
    script = Path(__file__).with_name("w8a16_interpreted.py")
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TRITON_INTERPRET": "1",
                                            "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_kernel_equals_the_dequantized_matmul_for_every_dtype_shape_and_bias(interpreted):
    cases = interpreted["cases"]
    assert len(cases) == 5 * 3 * 2
    for case in cases:
        rows, out_features, _ = case["shape"]
        assert case["out_dtype"] == case["dtype"] and case["out_shape"] == [rows, out_features]
        assert case["error"] < TOLERANCE[case["dtype"]], case


def test_kernel_agrees_with_the_cpu_int8_kernel(interpreted):
    assert interpreted["cpu_kernel_error"] < 1e-2


def test_mismatched_shapes_are_a_clear_error(interpreted):
    assert all(message.startswith("shapes do not fit") for message in interpreted["shape_errors"])


def test_cpu_tensors_never_take_the_kernel():
    assert not w8a16_triton.usable(torch.randn(1, 8))


def test_narrow_column_blocks_when_the_weight_has_few_columns():
    assert w8a16_triton._blocks(1, 4096, 1) == (16, 64, 128)
    assert w8a16_triton._blocks(1, 1024, 264)[:2] == (16, 16)  # 132 SMs x 2 programs wanted
    assert w8a16_triton._blocks(40, 4096, 1)[0] == 64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_int8_linear_takes_the_kernel_and_matches_the_dequantized_path():
    from inference.layers.linear import Int8Linear

    linear = torch.nn.Linear(4096, 1000, bias=True).to("cuda", torch.bfloat16)
    int8 = Int8Linear.from_linear(linear)
    for rows in (1, 5, 64, 65):
        x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
        assert w8a16_triton.usable(x) == (rows <= w8a16_triton.MAX_ROWS)
        dequantized = (x.float() @ (int8.weight.float() * int8.scales.float()[:, None]).t()
                       + int8.bias.float())
        error = (int8(x).float() - dequantized).abs().max() / dequantized.abs().max()
        assert error < 1e-2, (rows, error)
