"""DeepSeek Sparse Attention's two hot loops through `dsa_kernels.c` on the CPU, fp32.

`inference/layers/dsa_indexer.py` and `inference/layers/dsa.py` call these where the kernels are
built (`cpu_kernels.available()`) and the tensors are fp32 CPU ones, and keep their torch paths
elsewhere (CUDA, bf16, no compiler): the same choice and the same attention, in another order of
summation.
"""

from __future__ import annotations

import torch

from inference.layers.kernels import cpu_kernels

PANEL = 128  # dsa_kernels.c's PANEL: keys a panel of the transposed keys, [panels, D, PANEL]
# queries from which scoring against the keys transposed pays (a copy of every key a call: ~4 ms
# at 32k positions, fresh pages and the strided copy); fewer are scored by torch's product on the
# keys in place, or, read through a paged pool's slots, by the kernel
TRANSPOSE_ROWS = 16
# heads from which the kernel scores a few queries better than the library's product: it puts
# the heads along its vectors (16 lanes), so fewer leave lanes empty (GLM-5's 32 index heads at
# 32k positions: 1.8 against 3.0 ms a decode row on a 2-core AVX-512 EPYC; 4 heads: 0.39 / 0.35)
KERNEL_HEADS = 16


def usable(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) and cpu_kernels.available()


def select(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor, count: int,
           scale: float, slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The indexer's choice `[n, count]` for queries `q [n, H, D]` (rotated) with head weights
    `weights [n, H]` against `keys [T, D]` (with `slots [T]`: position p's key is
    `keys[slots[p]]`, a paged pool): as `Indexer.select`, a query's own and earlier positions
    first (in position order), filler after them where it has fewer than `count`; and
    `tied [n]` (bool): the queries whose `count`-th best score is equal to one left out. The
    kernel does not choose among such equal scores as torch's top-k (the reference) does, whose
    choice follows where its selection algorithm leaves them: their rows are refused, the caller
    chooses them with torch."""
    n, heads, dim = q.shape
    q, weights = q.contiguous(), weights.contiguous()
    positions = positions.to(torch.long).contiguous()
    out = torch.empty(n, count, dtype=torch.long)
    tied = torch.zeros(n, dtype=torch.bool)
    threads, lib = torch.get_num_threads(), cpu_kernels.library()
    if n < TRANSPOSE_ROWS and slots is None and heads < KERNEL_HEADS:
        # A few queries of few heads against keys held in one piece: the library's product scores
        # them (one pass over the keys for every head), the kernel picks the top `count`
        scores = torch.matmul(q.reshape(n * heads, dim), keys.t()).mul_(scale).relu_()
        scores = torch.bmm(weights[:, None], scores.view(n, heads, -1))[:, 0].contiguous()  # [n, T]
        lib.wecom_dsa_top_rows(scores.data_ptr(), scores.shape[1], positions.data_ptr(), n, count, out.data_ptr(),
                               tied.data_ptr(), threads)
        return out, tied
    if n < TRANSPOSE_ROWS:
        keys = keys.contiguous()
        slots = None if slots is None else slots.to(torch.long).contiguous()
        lib.wecom_dsa_select_rows(q.data_ptr(), weights.data_ptr(), keys.data_ptr(),
                                  None if slots is None else slots.data_ptr(), positions.data_ptr(), n, heads,
                                  dim, count, scale, out.data_ptr(), tied.data_ptr(), threads)
        return out, tied
    if slots is not None:
        keys = keys[slots]
    total = keys.shape[0]
    panels = -(-total // PANEL)
    padded = keys.new_zeros(panels * PANEL, dim)
    padded[:total] = keys
    transposed = padded.view(panels, PANEL, dim).transpose(1, 2).contiguous()
    lib.wecom_dsa_select(q.data_ptr(), weights.data_ptr(), transposed.data_ptr(), panels * PANEL,
                         positions.data_ptr(), n, heads, dim, count, scale, out.data_ptr(), tied.data_ptr(), threads)
    return out, tied


def attend(query: torch.Tensor, latents: torch.Tensor, picked: torch.Tensor, positions: torch.Tensor, rank: int,
           scale: float, rows: torch.Tensor | None = None) -> torch.Tensor:
    """`query [H, n, W]` (absorbed) over the latent rows of its queries' chosen positions
    `picked [n, k]` (those after a query's own skipped), held in rows `rows [n, k]` of
    `latents [T, W]` (default: `picked`): `[H, n, rank]`, as `DSAttention._selected`."""
    heads, n, width = query.shape
    if query.stride(2) != 1:
        query = query.contiguous()
    latents, picked = latents.contiguous(), picked.contiguous()
    rows = picked if rows is None else rows.to(torch.long).contiguous()
    positions = positions.to(torch.long).contiguous()
    out = torch.empty(n, heads, rank)
    cpu_kernels.library().wecom_dsa_attend(
        query.data_ptr(), query.stride(1), query.stride(0), latents.data_ptr(), picked.data_ptr(), rows.data_ptr(),
        positions.data_ptr(), n, heads, width, rank, picked.shape[1], scale, out.data_ptr(), torch.get_num_threads())
    return out.transpose(0, 1)
