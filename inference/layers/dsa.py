"""DeepSeek Sparse Attention as GLM-5 (`glm_moe_dsa`) runs it: Multi-head Latent Attention
(inference/layers/mla.py) in which each query attends only to the `index_topk` positions its
layer's lightning indexer chose (inference/layers/dsa_indexer.py), or, in a "shared" layer, the
ones the previous full layer chose (`indexer_types`, GLM-5's cross-layer top-k sharing). A query
with fewer earlier positions than `index_topk` sees them all: dense causal MLA.

The chosen positions' latent rows are gathered per query and attended in latent space (the
query absorbed through `kv_b_proj`, as MLA's decode), in tiles whose gathered rows stay under
`GATHER_VALUES`, so neither a long prefill nor a long context builds a dense mask or per-head
keys: a query costs `index_topk` rows of attention whatever the context's length (plus the
indexer's cheap pass over every position). On the CPU in fp32 the compiled kernel
(`inference/layers/kernels/dsa_cpu.py`) does it without the gathered copies: each chosen row is read
where the cache holds it, once for every head, with an online softmax.
"""

from __future__ import annotations

import torch

from inference.config import ModelConfig
from inference.layers.caches.dsa import IndexedContext
from inference.layers.dsa_indexer import Indexer
from inference.layers.kernels import dsa_cpu, paged_decode_triton
from inference.layers.mla import MLAttention

GATHER_VALUES = 1 << 24  # gathered latent values a tile holds (64 MiB in fp32)


class DSAttention(MLAttention):
    """MLA plus, in a full layer, its indexer (`self_attn.indexer.*` in the checkpoints)."""

    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__(config)
        # an MTP layer (index num_hidden_layers on) runs its own indexer, as the published
        # GLM-5 / DeepSeek-V3.2 checkpoints carry one there
        kind = config.indexer_types[index] if index < config.num_hidden_layers else "full"
        self.indexer = Indexer(config) if kind == "full" else None

    def forward(self, x: torch.Tensor, rotations: torch.Tensor, cache,
                chosen: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """`x [T, hidden]`, the step's rows (one sequence's, or a paged batch's sequence after
        sequence); `chosen`: the previous full layer's choice, one `[rows, k]` per sequence
        (a shared layer attends to it). Returns the output and this layer's choice."""
        q_nope, q_rope, latents, resid = self.project(x, rotations)
        keys = None if self.indexer is None else self.indexer.keys(x, rotations)
        contexts: list[IndexedContext] = cache.extend(latents, keys)
        query = torch.cat((self.kv_b_proj.absorb(q_nope), q_rope), dim=-1)  # [H, T, r + dr]
        if getattr(cache, "batched_decode", False):
            return self._batched_decode(x, resid, rotations, contexts, query, chosen)
        outs, mine, a = [], [], 0
        for i, ctx in enumerate(contexts):
            rows = slice(a, a + ctx.num_new)
            positions = torch.arange(ctx.q_start, ctx.q_start + ctx.num_new, device=x.device)
            if self.indexer is not None:
                picked = self.indexer.select(x[rows], resid[rows], rotations[rows], ctx.index_keys, positions,
                                             ctx.slots)
            elif chosen is None:
                raise ValueError("a shared DSA layer needs the choice of a full layer before it")
            else:
                picked = chosen[i]
            mine.append(picked)
            outs.append(self._selected(query[:, rows], ctx.latents, picked, positions, ctx.rows_of(picked)))
            a = rows.stop
        out = self.kv_b_proj.values(outs[0] if len(outs) == 1 else torch.cat(outs, dim=1))  # [H, T, dv]
        return self.o_proj(out.transpose(0, 1).reshape(x.shape[0], self.heads * self.v_dim)), mine

    def _batched_decode(self, x: torch.Tensor, resid: torch.Tensor, rotations: torch.Tensor,
                        contexts: list[IndexedContext], query: torch.Tensor,
                        chosen: list[torch.Tensor] | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A decode-only paged step on CUDA: each sequence's one row picks its positions, then one
        launch attends every row to its chosen latent rows, read in the pool through their slots
        (the indexer lists a row's own and earlier positions first, so each row's count of them
        is how far its list is read)."""
        mine, rows, counts = [], [], []
        for i, ctx in enumerate(contexts):
            position = torch.tensor([ctx.q_start], device=x.device)
            if self.indexer is not None:
                picked = self.indexer.select(x[i : i + 1], resid[i : i + 1], rotations[i : i + 1], ctx.index_keys,
                                             position, ctx.slots)
            elif chosen is None:
                raise ValueError("a shared DSA layer needs the choice of a full layer before it")
            else:
                picked = chosen[i]
            mine.append(picked)
            rows.append(ctx.rows_of(picked[0]))
            counts.append(min(picked.shape[1], ctx.q_start + 1))
        table = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
        out = paged_decode_triton.latent_decode(query.transpose(0, 1), contexts[0].latents, table,
                                                torch.tensor(counts, device=x.device), self.rank, self.scale)
        out = self.kv_b_proj.values(out.transpose(0, 1))  # [H, B, dv]
        return self.o_proj(out.transpose(0, 1).reshape(x.shape[0], self.heads * self.v_dim)), mine

    def _selected(self, query: torch.Tensor, latents: torch.Tensor, picked: torch.Tensor,
                  positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """`query [H, n, r + dr]` (absorbed) against the latents of its rows' chosen positions
        `picked [n, k]`, held in rows `rows [n, k]` of `latents`; a chosen position after the
        query's own (filler, where it has fewer than k earlier ones) is masked. Returns `[H, n, r]`."""
        if paged_decode_triton.wanted(query.device):
            # on CUDA, one launch for every query (a prefill's or a chunk's): each row's chosen
            # latent rows read where they lie; a query's own and earlier positions come first
            # in its list (`Indexer.select`), so it reads min(k, position + 1) of them
            counts = (positions + 1).clamp(max=picked.shape[1])
            out = paged_decode_triton.latent_decode(query.transpose(0, 1), latents, rows, counts, self.rank,
                                                    self.scale)
            return out.transpose(0, 1)
        if dsa_cpu.usable(query, latents):
            return dsa_cpu.attend(query, latents, picked, positions, self.rank, self.scale, rows)
        heads, n = query.shape[0], query.shape[1]
        out = query.new_empty(n, heads, self.rank)
        query = query.transpose(0, 1)  # [n, H, r + dr]: one small matmul per query
        tile = max(1, GATHER_VALUES // max(1, picked.shape[1] * latents.shape[1]))
        last = positions.tolist()
        for a in range(0, n, tile):
            b = min(a + tile, n)
            # the indexer lists a query's own and earlier positions first: past the tile's last
            # position + 1 columns there is only filler (the start of a prefill)
            width = last[b - 1] + 1
            chosen = picked[a:b, :width]
            gathered = latents.index_select(0, rows[a:b, :width].reshape(-1)).view(*chosen.shape, -1)
            scores = torch.bmm(query[a:b], gathered.transpose(1, 2)).float() * self.scale  # [t, H, k]
            scores.masked_fill_((chosen > positions[a:b, None])[:, None], float("-inf"))
            weights = torch.softmax(scores, dim=-1).to(gathered.dtype)
            out[a:b] = torch.bmm(weights, gathered[..., : self.rank])
        return out.transpose(0, 1)
