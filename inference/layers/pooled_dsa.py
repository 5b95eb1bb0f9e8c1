"""GLM-5.3-Flash's (`glm5_next`) sparse attention layers, as transformers 5.24's
`Glm5NextTextAttention` and `Glm5NextTextIndexer` compute them: MLA without a rotary part
(`qk_rope_head_dim` 0, no positional encoding at all: the KDA layers carry order) whose queries
attend to the positions an indexer picks by pools.

The indexer scores pools of `index_kpool` consecutive positions, not positions: a complete pool's
key is a per-channel softmax-weighted mean of its positions' keys (`k_norm(wk(x))`), the weights
from `index_kpool_compress_gate @ x` plus a learned per-slot `index_kpool_compress_ape`; a query
scores the complete pools that end at or before it, `sum_h w_h relu(q_h . pool / sqrt(d))` as
DSA's lightning indexer (no rotary), keeps the `index_topk / index_kpool` best (torch's top-k over
the complete pools, those after the query at the dtype's minimum, as transformers ranks them), and, with
`index_kpool_always_select_tail`, every position of its own incomplete pool. The cache keeps, per
position of a full layer, `[k ; compress_gate @ x]` (2 x `index_head_dim`) beside the latent row
(inference/layers/caches/dsa.py's caches with that key width); pools are made from them per call.

The attention over the picked positions is DSA's (inference/layers/dsa.py's, absorbed into latent
space; the compiled CPU kernel where built): an entry of -1 (no pool there) is skipped.
"""

from __future__ import annotations

import torch
from torch import nn

from inference.config import ModelConfig
from inference.layers.caches.dsa import IndexedContext
from inference.layers.kernels import dsa_cpu
from inference.layers.linear import Linear
from inference.layers.mla import LatentProjection
from inference.layers.norm import RMSNorm

GATHER_VALUES = 1 << 24  # gathered latent values a tile of the torch attention holds (64 MiB in fp32)


class PooledIndexer(nn.Module):
    """`self_attn.indexer.*` in the checkpoints."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.heads, self.head_dim, self.topk = config.index_n_heads, config.index_head_dim, config.index_topk
        self.pool, self.tail = config.index_kpool, config.index_kpool_always_select_tail
        self.wq_b = Linear(config.q_lora_rank, self.heads * self.head_dim)
        self.wk = Linear(config.hidden_size, self.head_dim)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = Linear(config.hidden_size, self.heads)
        self.index_kpool_compress_ape = nn.Parameter(torch.empty(self.pool, self.head_dim))
        self.index_kpool_compress_gate = nn.Parameter(torch.empty(self.head_dim, config.hidden_size))

    @property
    def width(self) -> int:
        """Entries of a query's choice: `index_topk`, plus the tail's `index_kpool - 1`."""
        return self.topk + (self.pool - 1 if self.tail else 0)

    def keys(self, x: torch.Tensor) -> torch.Tensor:
        """What the cache keeps of positions `x [L, hidden]`: `[L, 2 * index_head_dim]`."""
        gate = x @ self.index_kpool_compress_gate.t().to(x.dtype)
        return torch.cat((self.k_norm(self.wk(x)), gate), dim=-1)

    def pooled(self, keys: torch.Tensor) -> torch.Tensor:
        """The keys `[C, index_head_dim]` of the complete pools of the cached `keys [T, 2d]`."""
        complete = keys.shape[0] // self.pool
        grouped = keys[: complete * self.pool].float().view(complete, self.pool, 2 * self.head_dim)
        k, gate = grouped[..., : self.head_dim], grouped[..., self.head_dim :]
        weights = (gate + self.index_kpool_compress_ape.float()[None]).softmax(dim=1)
        return (weights * k).sum(dim=1)

    def select(self, x: torch.Tensor, q_resid: torch.Tensor, keys: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """The positions `[n, width]` the queries of `x [n, hidden]` (at `positions`, query
        residuals `q_resid`) attend to, against the cached `keys [T, 2d]` of positions 0..T-1;
        -1 where there is none."""
        n = x.shape[0]
        pooled = self.pooled(keys)  # the complete pools: transformers ranks those alone
        pools = pooled.shape[0]
        q = self.wq_b(q_resid).view(n, self.heads, self.head_dim).float()
        scores = torch.matmul(q, pooled.t()[None]).mul_(self.head_dim**-0.5).relu_()  # [n, H, C]
        weights = self.weights_proj(x).float() * self.heads**-0.5
        index = torch.matmul(weights[:, None], scores)[:, 0]  # [n, pools]
        ends = torch.arange(1, pools + 1, device=x.device) * self.pool - 1
        visible = ends[None] <= positions[:, None]  # [n, pools]: complete and at or before the query
        index.masked_fill_(~visible, torch.finfo(torch.float32).min)
        chosen = index.topk(min(self.topk // self.pool, pools), dim=-1).indices
        offsets = torch.arange(self.pool, device=x.device)
        picked = (chosen[..., None] * self.pool + offsets).masked_fill(~visible.gather(1, chosen)[..., None], -1)
        parts = [picked.flatten(1)]
        if self.tail and self.pool > 1:
            count = (positions + 1) % self.pool
            start = positions + 1 - count
            tail = start[:, None] + offsets[None, :-1]
            parts.append(tail.masked_fill(offsets[None, :-1] >= count[:, None], -1))
        out = torch.cat(parts, dim=1)
        return torch.nn.functional.pad(out, (0, self.width - out.shape[1]), value=-1)


class PooledDSAttention(nn.Module):
    """One sparse layer: q LoRA, a latent of `kv_lora_rank`, no rotary; `index` None in a
    "shared" layer (it attends to the previous full layer's choice)."""

    def __init__(self, config: ModelConfig, full: bool) -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.heads, self.rank, self.nope_dim, self.v_dim = heads, config.kv_lora_rank, config.qk_nope_head_dim, \
            config.v_head_dim
        self.q_a_proj = Linear(hidden, config.q_lora_rank, bias=config.attention_bias)
        self.q_a_layernorm = RMSNorm(config.q_lora_rank, config.rms_norm_eps)
        self.q_b_proj = Linear(config.q_lora_rank, heads * self.nope_dim)
        self.kv_a_proj_with_mqa = Linear(hidden, self.rank, bias=config.attention_bias)
        self.kv_a_layernorm = RMSNorm(self.rank, config.rms_norm_eps)
        self.kv_b_proj = LatentProjection(heads, self.rank, self.nope_dim, self.v_dim)
        self.o_proj = Linear(heads * self.v_dim, hidden, bias=config.attention_bias)
        self.scale = self.nope_dim**-0.5
        self.indexer = PooledIndexer(config) if full else None

    def forward(self, x: torch.Tensor, cache, chosen: list[torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """`x [T, hidden]` normed rows (one sequence's, or a paged batch's one after another);
        `chosen` the previous full layer's picks, one `[rows, width]` a sequence. Returns the
        output and this layer's picks."""
        resid = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(resid).view(x.shape[0], self.heads, self.nope_dim).transpose(0, 1)
        latents = self.kv_a_layernorm(self.kv_a_proj_with_mqa(x))
        keys = None if self.indexer is None else self.indexer.keys(x)
        contexts: list[IndexedContext] = cache.extend(latents, keys)
        query = self.kv_b_proj.absorb(q)  # [H, T, r]
        outs, mine, a = [], [], 0
        for i, ctx in enumerate(contexts):
            rows = slice(a, a + ctx.num_new)
            positions = torch.arange(ctx.q_start, ctx.q_start + ctx.num_new, device=x.device)
            if self.indexer is not None:
                index_keys = ctx.index_keys if ctx.slots is None else ctx.index_keys[ctx.slots]
                picked = self.indexer.select(x[rows], resid[rows], index_keys, positions)
            elif chosen is None:
                raise ValueError("a shared sparse layer needs the choice of the full layer just before it")
            else:
                picked = chosen[i]
            mine.append(picked)
            outs.append(self._attend(query[:, rows], ctx, picked, positions))
            a = rows.stop
        out = self.kv_b_proj.values(outs[0] if len(outs) == 1 else torch.cat(outs, dim=1))  # [H, T, dv]
        return self.o_proj(out.transpose(0, 1).reshape(x.shape[0], self.heads * self.v_dim)), mine

    def _attend(self, query: torch.Tensor, ctx: IndexedContext, picked: torch.Tensor,
                positions: torch.Tensor) -> torch.Tensor:
        """`query [H, n, r]` over the latents of its picks (-1: none); `[H, n, r]`."""
        valid = picked >= 0
        # an entry that is no position reads as one after the query's own: skipped
        masked = torch.where(valid, picked, positions[:, None] + 1)
        rows = ctx.rows_of(picked.clamp(min=0)).masked_fill(~valid, 0)
        latents = ctx.latents
        if dsa_cpu.usable(query, latents):
            return dsa_cpu.attend(query, latents, masked, positions, self.rank, self.scale, rows)
        heads, n = query.shape[0], query.shape[1]
        out = query.new_empty(n, heads, self.rank)
        query = query.transpose(0, 1)
        tile = max(1, GATHER_VALUES // max(1, picked.shape[1] * latents.shape[1]))
        for a in range(0, n, tile):
            b = min(a + tile, n)
            gathered = latents.index_select(0, rows[a:b].reshape(-1)).view(b - a, picked.shape[1], -1)
            scores = torch.bmm(query[a:b], gathered.transpose(1, 2)).float() * self.scale  # [t, H, k]
            scores.masked_fill_(~valid[a:b, None], float("-inf"))
            # a query with no pick (no complete pool yet, no tail) gets zeros, as transformers'
            # SDPA gives a row whose mask is all False (and the compiled kernel gives)
            weights = torch.softmax(scores, dim=-1).nan_to_num_(0.0).to(gathered.dtype)
            out[a:b] = torch.bmm(weights, gathered)
        return out.transpose(0, 1)
