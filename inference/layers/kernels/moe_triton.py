"""Routed experts on CUDA in two grouped launches (Triton), not a Python loop over experts.

`MoE.routed` sorts a batch's (token, expert) pairs by expert and runs each chosen expert on its
run of rows: on a GPU that is up to `n_routed_experts` small matmuls a layer launched from
Python, after a host sync for the counts. Here the pairs are laid out by expert, each expert's
run padded to `BLOCK_M` rows, entirely on the device (no sync); one launch computes every
block's gate/up projection with its own expert's weights (`[E, 2I, H]`, stacked once: each
expert's weights then become views of the stack, so nothing is held twice), `silu(gate) * up`
follows, and one more launch the down projection times the routing weight; the pairs are read
back in (token, k) order and summed over k.

Plain (bf16/fp16/fp32) experts only: int8 experts keep the loop, whose `Int8Linear` has its own
kernel. Correctness is tested on the CPU through Triton's interpreter (`TRITON_INTERPRET=1`,
`INFERENCE_TRITON_ATTENTION=interpret`, as the attention programs); not yet timed on a GPU.
"""

from __future__ import annotations

import functools

import torch

from inference.layers.activation import silu_and_mul
from inference.layers.kernels import paged_decode_triton

BLOCK_M = 16  # rows of one expert a program takes (each expert's run is padded to a multiple)
CALLS = {"grouped": 0}  # launches so far (what the tests check was taken)


def wanted(x: torch.Tensor) -> bool:
    """Whether `x`'s experts run through the grouped kernel (CUDA, or CPU under the interpreter
    when told; the same switch as the attention programs)."""
    return paged_decode_triton.wanted(x.device) and _kernel() is not None


@functools.cache
def _kernel():
    try:
        from inference.layers.kernels.moe_programs import grouped_gemm_kernel
    except ImportError:
        return None
    return grouped_gemm_kernel


class Layout:
    """Where each (token, k) pair's row lies once grouped by expert, all computed on the device:
    `rows [R]` the token of each grouped row (-1: padding), `scales [R]` its routing weight,
    `dest [T * k]` the grouped row of each pair, `block_expert [R / BLOCK_M]` each block's expert
    (-1: a block past the used rows). R bounds the padded total without reading the counts."""

    def __init__(self, experts: torch.Tensor, weights: torch.Tensor, num_experts: int) -> None:
        device = experts.device
        top_k = experts.shape[1]
        flat = experts.flatten()
        pairs = flat.numel()
        counts = torch.bincount(flat, minlength=num_experts)
        padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        padded_end = padded.cumsum(0)
        order = flat.argsort(stable=True)  # the pairs grouped by expert
        grouped = flat[order]
        first = counts.cumsum(0) - counts  # each expert's first pair in `order`
        at = (padded_end - padded)[grouped] + torch.arange(pairs, device=device) - first[grouped]
        # every used expert wastes at most BLOCK_M - 1 rows, and at most `pairs` experts are used
        total = -(-(pairs + min(num_experts, pairs) * (BLOCK_M - 1)) // BLOCK_M) * BLOCK_M
        self.rows = torch.full((total,), -1, dtype=torch.int32, device=device)
        self.rows[at] = (order // top_k).to(torch.int32)
        self.scales = torch.zeros(total, dtype=torch.float32, device=device)
        self.scales[at] = weights.flatten()[order].float()
        self.dest = torch.empty_like(order)
        self.dest[order] = at
        starts = torch.arange(0, total, BLOCK_M, device=device)
        block_expert = torch.searchsorted(padded_end, starts, right=True)
        self.block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
        self.grouped_rows = torch.where(self.rows >= 0, torch.arange(total, device=device, dtype=torch.int32), -1)


def grouped_matmul(a: torch.Tensor, weight: torch.Tensor, rows: torch.Tensor, block_expert: torch.Tensor,
                   scales: torch.Tensor | None = None, block_n: int = 64, block_k: int = 32) -> torch.Tensor:
    """`out[r] = a[rows[r]] @ weight[e].T` (times `scales[r]`) for each grouped row r of a block
    whose expert is e; `a [M, K]`, `weight [E, N, K]`; rows of padding are left unwritten."""
    weight = weight if weight.stride(2) == 1 else weight.contiguous()
    a = a if a.stride(1) == 1 else a.contiguous()
    n, k = weight.shape[1], weight.shape[2]
    out = a.new_empty(rows.shape[0], n)
    interpreted = a.device.type != "cuda"
    CALLS["grouped"] += 1
    _kernel()[(block_expert.shape[0], -(-n // block_n))](
        a, weight, out, rows, block_expert, scales if scales is not None else rows, n, k,
        a.stride(0), weight.stride(0), weight.stride(1), out.stride(0),
        SCALED=scales is not None, IEEE=a.dtype == torch.float32 or interpreted, UPCAST=interpreted,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k)
    return out


def routed(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, gate_up: torch.Tensor,
           down: torch.Tensor) -> torch.Tensor:
    """`MoE.routed` in two launches: `x [T, H]`, the router's `weights`/`experts [T, k]`,
    the experts' stacked `gate_up [E, 2I, H]` and `down [E, H, I]`. Returns `[T, H]`."""
    layout = Layout(experts, weights, gate_up.shape[0])
    hidden = silu_and_mul(grouped_matmul(x, gate_up, layout.rows, layout.block_expert))
    done = grouped_matmul(hidden, down, layout.grouped_rows, layout.block_expert, layout.scales)
    return done[layout.dest].view(x.shape[0], experts.shape[1], -1).sum(dim=1)
