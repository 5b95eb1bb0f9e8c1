"""DeepSeek Sparse Attention's lightning indexer, as GLM-5 (`glm_moe_dsa`) runs it.

Each query picks the `index_topk` earlier positions its layer's attention will see, by a cheap
score of its own: `index_n_heads` small heads of `index_head_dim`,
    score(t, s) = sum_h  w_h(t) * relu(q_h(t) . k(s) / sqrt(index_head_dim)),
with q from the attention's query residual (`q_a_layernorm(q_a_proj(x))`, through `wq_b`), one
key per position (`k_norm(wk(x))`, a LayerNorm with bias), per-head weights
`weights_proj(x) / sqrt(index_n_heads)`, and interleaved-pair rotary on the first
`qk_rope_head_dim` channels of q and k. A query at position t scores positions 0..t and keeps the
`min(index_topk, t + 1)` best (torch's `topk`, as transformers). Only the indexer's keys are
cached (`index_head_dim` values a position and layer), beside MLA's latent. In "shared" layers
(`indexer_types`) no indexer runs: they reuse the previous full layer's choice.

Queries are scored in tiles of `QUERY_TILE`, so a long prefill never holds a
`[queries, heads, positions]` score tensor whole (32k x 32 heads x 32k would be 128 GiB). On the
CPU in fp32 the compiled kernel (`inference/layers/kernels/dsa_cpu.py`) scores a query's earlier
positions only, in registers, and selects with a radix select instead of a sort.
"""

from __future__ import annotations

import torch
from torch import nn

from inference.config import ModelConfig
from inference.layers.kernels import dsa_cpu
from inference.layers.linear import Linear
from inference.layers.rotary import apply_rotary_

QUERY_TILE = 128


class Indexer(nn.Module):
    """Weight names as the checkpoints store them (`self_attn.indexer.*`)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.heads, self.head_dim, self.topk = config.index_n_heads, config.index_head_dim, config.index_topk
        self.wq_b = Linear(config.q_lora_rank, self.heads * self.head_dim)
        self.wk = Linear(config.hidden_size, self.head_dim)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = Linear(config.hidden_size, self.heads)

    def keys(self, x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
        """The keys `[L, index_head_dim]` of the positions of `x [L, hidden]`: what the cache keeps."""
        k = self.k_norm(self.wk(x))[:, None]
        return apply_rotary_(k.contiguous(), rotations)[:, 0]

    def select(self, x: torch.Tensor, q_resid: torch.Tensor, rotations: torch.Tensor, keys: torch.Tensor,
               positions: torch.Tensor, slots: torch.Tensor | None = None) -> torch.Tensor:
        """For the queries of `x [L, hidden]` (at `positions [L]`, their query residuals `q_resid`)
        against the cached `keys [T, index_head_dim]` of positions 0..T-1 (with `slots [T]`: in
        rows `keys[slots]` of a pool): the chosen positions `[L, min(index_topk, T)]` (int64). A
        query's row holds positions after its own only where it has fewer than `index_topk`
        earlier ones (they come last, with score -inf)."""
        n = x.shape[0]
        if slots is not None and not (dsa_cpu.usable(keys) and n < dsa_cpu.TRANSPOSE_ROWS):
            keys, slots = keys[slots], None  # the kernel for a few rows reads the pool in place
        q = self.wq_b(q_resid).view(n, self.heads, self.head_dim)
        q = apply_rotary_(q.contiguous(), rotations).float()
        weights = self.weights_proj(x).float() * self.heads**-0.5
        keys = keys.float()
        count = min(self.topk, keys.shape[0] if slots is None else slots.shape[0])
        scale = self.head_dim**-0.5
        if dsa_cpu.usable(q, keys):
            out, tied = dsa_cpu.select(q, weights, keys, positions, count, scale, slots)
            if tied.any():  # rows the kernel refused: an equal score on either side of the boundary
                keys = keys if slots is None else keys[slots]
                out[tied] = self._choose(q[tied], weights[tied], keys, positions[tied], count, scale)
            return out
        return self._choose(q, weights, keys, positions, count, scale)

    def _choose(self, q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor,
                count: int, scale: float) -> torch.Tensor:
        """`select`'s choice with torch's ops (transformers' own: the same top-k, ties included)."""
        n = q.shape[0]
        out = torch.empty(n, count, dtype=torch.long, device=q.device)
        key_positions = None
        last = keys.shape[0] - 1
        for a in range(0, n, QUERY_TILE):
            b = min(a + QUERY_TILE, n)
            scores = (q[a:b].reshape(-1, self.head_dim) @ keys.t()).mul_(scale).relu_()  # [t * heads, T]
            index = torch.bmm(weights[a:b, None], scores.view(b - a, self.heads, -1))[:, 0]  # [t, T]
            if int(positions[a:b].min()) < last:  # some query has later positions to hide (not decode)
                if key_positions is None:
                    key_positions = torch.arange(keys.shape[0], device=q.device)
                index.masked_fill_(key_positions[None] > positions[a:b, None], float("-inf"))
            out[a:b] = index.topk(count, dim=-1).indices
        return out
