"""W8A16 linears on a CUDA GPU: `python -m bench.w8a16_cuda` (under a minute; needs CUDA and triton).

For decode-sized rows (1, 4, 8, 16, 64) against GLM-sized weights (4096x4096, 13696x4096,
4096x13696, 151552x4096 lm head), times in one process: plain bf16 `F.linear`, the Triton
W8A16 kernel (`inference/layers/kernels/w8a16_triton.py`) and the dequantize-per-call path it replaces;
prints microseconds, the kernel's speed against bf16 and its share of the GPU's read bandwidth
(measured here by a device-to-device copy). Expect int8 to approach 2x bf16 at few rows, where
reading the weight is all the work; at 64 rows compute starts to count.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from inference.layers.kernels import w8a16_triton
from inference.layers.linear import quantize_weight

SHAPES = [(4096, 4096), (13696, 4096), (4096, 13696), (151552, 4096)]
ROWS = (1, 4, 8, 16, 64)


def cuda_time_us(fn, repeats: int = 50) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / repeats


def read_bandwidth() -> float:
    """Bytes per second a device-to-device copy of 1 GiB reads."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return src.numel() / (cuda_time_us(lambda: dst.copy_(src), 20) / 1e6)


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("bench.w8a16_cuda needs a CUDA GPU (the CPU int8 figures are in bench.speculative)")
    if not w8a16_triton.usable(torch.empty(1, 8, device="cuda", dtype=torch.bfloat16)):
        sys.exit("the W8A16 Triton kernel is off: triton is missing or INFERENCE_W8A16_TRITON=0")
    bandwidth = read_bandwidth()
    print(f"W8A16 on {torch.cuda.get_device_name()}, copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    print(f"{'weight':>13} {'rows':>4} | {'bf16 us':>8} {'int8 us':>8} {'dequant us':>10} | "
          f"{'bf16/int8':>9} {'int8 % of bw':>12}")
    for out_features, in_features in SHAPES:
        dense = torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16)
        weight, scales = quantize_weight(dense)
        scales = scales.to(torch.bfloat16)
        for rows in ROWS:
            x = torch.randn(rows, in_features, device="cuda", dtype=torch.bfloat16)
            bf16 = cuda_time_us(lambda x=x, dense=dense: F.linear(x, dense))
            int8 = cuda_time_us(lambda x=x, w=weight, s=scales: w8a16_triton.matmul(x, w, s))
            dequant = cuda_time_us(
                lambda x=x, w=weight, s=scales: F.linear(x, w.to(torch.bfloat16)) * s)
            share = weight.numel() / (int8 / 1e6) / bandwidth
            print(f"{out_features:>6}x{in_features:<6} {rows:>4} | {bf16:8.1f} {int8:8.1f} "
                  f"{dequant:10.1f} | {bf16 / int8:8.2f}x {100 * share:11.0f} %")
        del dense, weight


if __name__ == "__main__":
    main()
