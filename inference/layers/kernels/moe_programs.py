"""The Triton program behind inference/layers/kernels/moe_triton.py (which says what it computes),
imported only when a step takes it (triton comes with PyTorch's CUDA wheels)."""

import triton.language as tl
from triton import jit


@jit
def grouped_gemm_kernel(a_ptr, w_ptr, out_ptr, rows_ptr, block_expert_ptr, scale_ptr, N, K,
                        stride_am, stride_we, stride_wn, stride_om,
                        SCALED: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    block, col_block = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + block)
    if expert < 0:  # past the rows the batch uses
        return
    r = block * BLOCK_M + tl.arange(0, BLOCK_M)
    row = tl.load(rows_ptr + r)
    valid = row >= 0
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    steps = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + steps
        a = tl.load(a_ptr + row[:, None].to(tl.int64) * stride_am + ks[None, :],
                    mask=valid[:, None] & (ks[None, :] < K), other=0.0)
        w = tl.load(w_ptr + expert.to(tl.int64) * stride_we + cols[None, :] * stride_wn + ks[:, None],
                    mask=(cols[None, :] < N) & (ks[:, None] < K), other=0.0)  # [BLOCK_K, BLOCK_N] of w.T
        if UPCAST:  # the interpreter's low-precision dot is wrong (triton 3.9): the same sums in fp32
            a, w = a.to(tl.float32), w.to(tl.float32)
        if IEEE:  # noqa: SIM108 - fp32 activations: no TF32 rounding of the inputs
            acc = tl.dot(a, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc)
    if SCALED:
        acc = acc * tl.load(scale_ptr + r, mask=valid, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptr + r[:, None].to(tl.int64) * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=valid[:, None] & (cols[None, :] < N))
