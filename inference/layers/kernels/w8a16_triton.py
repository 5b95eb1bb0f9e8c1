"""W8A16 on CUDA: one Triton kernel that reads the int8 weight once and dequantizes in registers.

Without it a CUDA `Int8Linear` dequantizes per call (`F.linear(x, w.to(dtype)) * scales`): the
int8 weight is read, a full bf16 copy written and read again, 5 bytes moved per parameter
against plain bf16's 2, so "int8" would be the slowest dtype on the GPU. Decoding and a
speculative verify are a few rows against a large weight, bound by reading the weight: here each
program takes `BLOCK_N` output channels, walks K in `BLOCK_K` steps (the int8 rows are contiguous
in K, so the loads coalesce), converts the tile to the activations' dtype (exact: int8 values
are integers that bf16, fp16 and fp32 all hold exactly) and accumulates `tl.dot` in fp32; the
per-channel scale and the bias are applied once at the end. Many rows (a prefill) are compute-
bound, where cuBLAS on a dequantized copy is the better tool, so `Int8Linear` keeps that path
for them (`MAX_ROWS`).

Triton comes with PyTorch's CUDA wheels (not with the CPU build); `INFERENCE_W8A16_TRITON=0`
turns the kernel off. Its correctness is tested on the CPU through Triton's interpreter
(`TRITON_INTERPRET=1`); its speed has not been measured on a GPU yet (see bench/speculative.py).
"""

from __future__ import annotations

import functools
import os

import torch

ENABLED = os.environ.get("INFERENCE_W8A16_TRITON", "1") != "0"
MAX_ROWS = 64  # more rows than this: dequantize once per call and let cuBLAS do the matmul
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def usable(x: torch.Tensor) -> bool:
    """Whether `matmul` serves `x` (2-D rows on CUDA, few enough, in a supported dtype, with
    triton installed). Never imports triton for a CPU tensor."""
    return (ENABLED and x.is_cuda and x.dim() == 2 and x.shape[0] <= MAX_ROWS
            and x.dtype in _DTYPES and _kernel() is not None)


@functools.cache
def _kernel():
    """The jitted kernel, made on first use (Triton decides then whether it is interpreted,
    from `TRITON_INTERPRET`); None without triton (torch's CPU build has none)."""
    try:
        import triton.language as tl
        from triton import jit
    except ImportError:
        return None

    @jit
    def w8a16_kernel(x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, M, N, K,
                     HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        steps = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            ks = start + steps
            x = tl.load(x_ptr + rows[:, None] * K + ks[None, :],
                        mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
            w = tl.load(w_ptr + cols[None, :] * K + ks[:, None],  # [BLOCK_K, BLOCK_N] of w.T
                        mask=(cols[None, :] < N) & (ks[:, None] < K), other=0)
            if UPCAST:  # the interpreter's bf16 dot is wrong (triton 3.9): the same sums in fp32
                x, w = x.to(tl.float32), w.to(tl.float32)
            else:
                w = w.to(x.dtype)
            if IEEE:  # noqa: SIM108 - fp32 activations: no TF32 rounding of the inputs
                acc = tl.dot(x, w, acc, input_precision="ieee")
            else:
                acc = tl.dot(x, w, acc)
        acc = acc * tl.load(scale_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=(rows[:, None] < M) & (cols[None, :] < N))

    return w8a16_kernel


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.cache  # asked by every decode-step linear: worked out once per shape
def _blocks(m: int, n: int, programs_wanted: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): `tl.dot` needs 16 rows at least; narrower column blocks
    when the weight has too few of them to give every multiprocessor work (decoding)."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    block_n = 64
    while block_n > 16 and _cdiv(n, block_n) < programs_wanted:
        block_n //= 2
    return block_m, block_n, 128 if block_m == 16 else 64


def _programs_wanted(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter (tests): any grid is correct
    return _twice_the_multiprocessors(device.index if device.index is not None
                                      else torch.cuda.current_device())


@functools.cache
def _twice_the_multiprocessors(index: int) -> int:
    return 2 * torch.cuda.get_device_properties(index).multi_processor_count


def matmul(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ (weight * scales[:, None]).T + bias` for x `[M, K]` (bf16/fp16/fp32), weight int8
    `[N, K]`, scales `[N]`; the result in x's dtype, accumulated in fp32."""
    kernel = _kernel()
    if kernel is None:
        raise RuntimeError("the W8A16 Triton kernel needs triton (PyTorch's CUDA wheels bring it)")
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k or scales.shape != (n,) or (bias is not None and bias.shape != (n,)):
        raise ValueError(f"shapes do not fit: x {tuple(x.shape)}, weight {tuple(weight.shape)}, "
                         f"scales {tuple(scales.shape)}")
    x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m, block_n, block_k = _blocks(m, n, _programs_wanted(x.device))
    interpreted = x.device.type != "cuda"  # only Triton's interpreter runs it off the GPU
    grid = (_cdiv(m, block_m), _cdiv(n, block_n))
    kernel[grid](x, weight, scales, bias if bias is not None else scales, out, m, n, k,
                 HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32 or interpreted,
                 UPCAST=interpreted,
                 BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return out
