"""Multi-head Latent Attention (DeepSeek-V2/V3; GLM-4.7-Flash, GLM-5), as transformers'
`Glm4MoeLiteAttention` computes it, on a cache of latents (inference/layers/caches/mla.py).

Per token: the query through a rank-`q_lora_rank` bottleneck (`q_a_proj`, an RMSNorm, `q_b_proj`;
one `q_proj` when the rank is null), `H` heads of `qk_nope_head_dim` (dn) + `qk_rope_head_dim`
(dr) channels; `kv_a_proj_with_mqa` gives one latent of `kv_lora_rank` (r), normed, plus one
key of dr that all heads share. Both dr parts turn with the rotary (DeepSeek's interleaved pairs
when `rope_interleave`, else halves; transformers' interleaved form writes its output as halves,
for q and k alike, so q.k is the same). The cache keeps `[latent ; rotated key]` per position.
`kv_b_proj` (`[H * (dn + dv), r]`) makes head h's key `W_uk[h] @ latent` and value
`W_uv[h] @ latent`, so

    score(t, s) = scale * (q_nope[h,t] . W_uk[h] c_s + q_rope[h,t] . k_rope_s)
                = scale * [q_nope[h,t] W_uk[h] ; q_rope[h,t]] . [c_s ; k_rope_s]
    out[h, t]   = W_uv[h] (sum_s p(t, s) c_s)

Absorbed (decode, speculative verifies, short chunks): the query is taken into latent space
once per row (`q_nope @ W_uk`, per head, for all rows of a step at once), attention is
one-key-head attention over the cached rows themselves (keys the whole row, values its first r
channels), and `W_uv` is applied to the attention output: nothing is expanded per cached token.
Expanded (long prefill chunks): the context's latents go through `kv_b_proj` into per-head keys
and values and SDPA runs on those, as transformers does. Per head, n new rows over S positions
cost absorbed ~ n r (dn + dv) + n S' (2r + dr) multiply-adds and expanded ~ S r (dn + dv) +
n S' (dn + dr + dv) (S' ~ S - n/2, causal): a fresh prefill (S = n) is cheaper expanded, a
decode row over a long context ~200x cheaper absorbed, and after a context a chunk pays to
expand from ~400 rows at GLM-4.7-Flash's sizes (r 512, dn 192, dr 64, dv 256). `expands` takes
the cheaper by that count, from `EXPAND_MIN_ROWS` rows on and while the expanded context fits
`EXPAND_MAX_VALUES`. Measured on this 2-core CPU (`attend`, one layer of those sizes, fp32),
absorbed / expanded time: fresh prefill of 8 / 32 / 128 / 512 / 2048 rows 0.49 / 0.95 / 1.14 /
1.25 / 1.73; after 2048 positions, 1 / 16 / 64 / 256 / 1024 rows 0.02 / 0.11 / 0.34 / 0.78 / 1.48;
after 8192, 1 / 64 / 256 / 1024 rows 0.01 / 0.26 / 0.77 / 1.67 (a GPU would want its own figures).
Both forms are exact: the same products summed in another order (~1e-6 relative in fp32).

The softmax scale is `(dn + dr) ** -0.5`, times `yarn_mscale(factor, mscale_all_dim) ** 2` under
YaRN (its rotary carries the other factor, `RotaryEmbedding.magnitude`).

`kv_b_proj` is a `LatentProjection`, not a `Linear`: its weight is read per head, never as one
matmul over the hidden state, so int8 (W8A16, which swaps `Linear` layers) leaves it in the model
dtype (`quantize_checkpoint` keeps it dense too): 216M parameters, 0.7 % of GLM-4.7-Flash's
weights, 216 MB more than int8 would take. The absorbed and expanded forms then read the same
weights, and no dequantized copy sits beside an int8 one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inference.config import ModelConfig
from inference.layers.caches.mla import LatentContext
from inference.layers.kernels import paged_decode_triton
from inference.layers.linear import Linear
from inference.layers.norm import RMSNorm
from inference.layers.rotary import apply_rotary_, yarn_mscale

# A sequence's chunk runs expanded from this many new rows on, where the multiply-adds say so
# (`MLAttention.expands`); below it the absorbed form was as fast or faster on this CPU anyway.
EXPAND_MIN_ROWS = 128
# ... and while the context's per-head keys and values (with kv_b_proj's output they come from)
# stay under this many values: GLM-4.7-Flash's 19,200 a position would take 2.5 GB in fp32 at 32k
# positions, for every layer's chunk; past it the chunk runs absorbed, tiled (1.3x slower at 8k).
EXPAND_MAX_VALUES = 1 << 28
ABSORBED_TILE = 64  # queries per SDPA call of an absorbed chunk (64-256 measured alike, 16 slower)
LATENT_NORM_EPS = 1e-6  # transformers builds q_a_layernorm and kv_a_layernorm with the default eps


class LatentProjection(nn.Module):
    """`kv_b_proj`: per head, `W_uk [dn, r]` (latent to the key's nope part) over
    `W_uv [dv, r]` (latent to the value), stored as the checkpoint has it, `[H * (dn + dv), r]`."""

    def __init__(self, heads: int, rank: int, nope_dim: int, v_dim: int) -> None:
        super().__init__()
        self.heads, self.nope_dim, self.v_dim = heads, nope_dim, v_dim
        self.weight = nn.Parameter(torch.empty(heads * (nope_dim + v_dim), rank))

    def per_head(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(`W_uk [H, dn, r]`, `W_uv [H, dv, r]`), views of the weight."""
        w = self.weight.view(self.heads, self.nope_dim + self.v_dim, -1)
        return w[:, : self.nope_dim], w[:, self.nope_dim :]

    def absorb(self, q_nope: torch.Tensor) -> torch.Tensor:
        """`q_nope [H, T, dn]` into latent space: `[H, T, r]`."""
        return torch.bmm(q_nope, self.per_head()[0])

    def values(self, latent_out: torch.Tensor) -> torch.Tensor:
        """Attention output in latent space `[H, T, r]` to each head's values `[H, T, dv]`."""
        return torch.bmm(latent_out, self.per_head()[1].transpose(1, 2))

    def expand(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head key nope parts `[H, S, dn]` and values `[H, S, dv]` of latents `[S, r]`."""
        kv = F.linear(latents, self.weight).view(latents.shape[0], self.heads, -1).transpose(0, 1)
        return kv[..., : self.nope_dim], kv[..., self.nope_dim :]


def _causal(queries: int, keys: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask `[queries, keys]` for the last `queries` of `keys` positions."""
    q = torch.arange(keys - queries, keys, device=device)[:, None]
    seen = torch.arange(keys, device=device)[None] <= q
    return torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, float("-inf"))


class MLAttention(nn.Module):
    """Projections, rotary and latent attention of one layer; the positions live in its cache."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.heads, self.rank = heads, config.kv_lora_rank
        self.nope_dim, self.rope_dim, self.v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        q_width = heads * (self.nope_dim + self.rope_dim)
        self.q_lora = config.q_lora_rank is not None
        if not self.q_lora:
            self.q_proj = Linear(hidden, q_width)
        else:
            self.q_a_proj = Linear(hidden, config.q_lora_rank, bias=config.attention_bias)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = Linear(config.q_lora_rank, q_width)
        self.kv_a_proj_with_mqa = Linear(hidden, self.rank + self.rope_dim, bias=config.attention_bias)
        self.kv_a_layernorm = RMSNorm(self.rank, LATENT_NORM_EPS)
        self.kv_b_proj = LatentProjection(heads, self.rank, self.nope_dim, self.v_dim)
        self.o_proj = Linear(heads * self.v_dim, hidden, bias=config.attention_bias)
        self.interleaved = config.rotary_interleaved
        # values per position that expanding makes: kv_b_proj's output, then the keys and values
        self.expanded_width = heads * (2 * (self.nope_dim + self.v_dim) + self.rope_dim)
        self.scale = (self.nope_dim + self.rope_dim) ** -0.5
        yarn = config.rope_scaling
        if yarn is not None and yarn.get("mscale_all_dim"):
            self.scale *= yarn_mscale(yarn["factor"], yarn["mscale_all_dim"]) ** 2

    def forward(self, x: torch.Tensor, rotations: torch.Tensor, cache) -> torch.Tensor:
        """`x [T, hidden]` normed input of the step's rows (one sequence's positions
        `[cache.length, ...)`, or the rows of a paged batch, sequence after sequence)."""
        q_nope, q_rope, latents, _ = self.project(x, rotations)
        table = getattr(cache, "latent_table", None)
        if table is not None and not any(self.expands(n, total) for n, total in zip(cache.plan.num_new,
                                                                                     cache.plan.totals, strict=True)):
            # a paged step on CUDA that runs absorbed (decode rows, verifies, short chunks): one
            # launch for the batch, each row against its sequence's positions up to its own
            cache.write(latents)
            query = torch.cat((self.kv_b_proj.absorb(q_nope), q_rope), dim=-1).transpose(0, 1)  # [T, H, r + dr]
            tables, reach, seq, page = table
            out = paged_decode_triton.latent_decode(query, cache.pool, tables, reach, self.rank, self.scale,
                                                    table_rows=seq, page=page)
            out = self.kv_b_proj.values(out.transpose(0, 1))
        else:
            out = self.attend(q_nope, q_rope, cache.extend(latents))
        return self.o_proj(out.transpose(0, 1).reshape(x.shape[0], self.heads * self.v_dim))

    def project(self, x: torch.Tensor, rotations: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The queries' nope and rotated parts `[H, T, dn]`, `[H, T, dr]`, the latent rows the
        cache keeps, `[T, r + dr]` (normed latent, rotated shared key), and the query residual
        `q_a_layernorm(q_a_proj(x))` (None without q LoRA; DSA's indexer reads it)."""
        resid = self.q_a_layernorm(self.q_a_proj(x)) if self.q_lora else None
        q = self.q_b_proj(resid) if self.q_lora else self.q_proj(x)
        q = q.view(x.shape[0], self.heads, -1)
        q_rope = apply_rotary_(q[..., self.nope_dim :].contiguous(), rotations, self.interleaved)
        kv = self.kv_a_proj_with_mqa(x)
        k_rope = apply_rotary_(kv[:, None, self.rank :].contiguous(), rotations, self.interleaved)
        latents = torch.cat((self.kv_a_layernorm(kv[:, : self.rank]), k_rope[:, 0]), dim=1)
        return q[..., : self.nope_dim].transpose(0, 1), q_rope.transpose(0, 1), latents, resid

    def attend(self, q_nope: torch.Tensor, q_rope: torch.Tensor, contexts: list[LatentContext]) -> torch.Tensor:
        """Each sequence's rows against its context, absorbed or expanded (`expands`); the
        per-row products of the absorbed form (`absorb`, `values`) run once for all its rows.
        Returns `[H, T, dv]`."""
        spans, a = [], 0
        for ctx in contexts:
            spans.append((ctx, slice(a, a + ctx.num_new), self.expands(ctx.num_new, ctx.latents.shape[0])))
            a += ctx.num_new
        absorbed = [(ctx, rows) for ctx, rows, expand in spans if not expand]
        if absorbed:
            query = torch.cat((self.kv_b_proj.absorb(q_nope), q_rope), dim=-1)  # [H, T, r + dr]
            parts = [self._absorbed(query[:, rows], ctx) for ctx, rows in absorbed]
            values = self.kv_b_proj.values(parts[0] if len(parts) == 1 else torch.cat(parts, dim=1))
            if len(absorbed) == len(spans):  # decode, verifies, short chunks: the rows in order
                return values
        out = q_nope.new_empty(q_nope.shape[0], q_nope.shape[1], self.v_dim)
        done = 0
        for ctx, rows, expand in spans:
            if expand:
                out[:, rows] = self._expanded(q_nope[:, rows], q_rope[:, rows], ctx)
            else:
                out[:, rows] = values[:, done : done + ctx.num_new]
                done += ctx.num_new
        return out

    def expands(self, new: int, total: int) -> bool:
        """Whether a sequence's `new` rows attending to `total` positions run expanded: from
        `EXPAND_MIN_ROWS` rows on, within `EXPAND_MAX_VALUES`, when expanding the context costs
        fewer multiply-adds than the absorbed form's wider attention (see the module docstring)."""
        if new < EXPAND_MIN_ROWS or total * self.expanded_width > EXPAND_MAX_VALUES:
            return False
        per_query = 2 * self.rank - self.nope_dim - self.v_dim  # absorbed attention's extra width
        return (total - new) * self.rank * (self.nope_dim + self.v_dim) < new * (total - new / 2) * per_query

    def _absorbed(self, query: torch.Tensor, ctx: LatentContext) -> torch.Tensor:
        """Attention in latent space of `query [H, n, r + dr]` (absorbed): one key head, the
        cached rows themselves (values: their first r channels), the heads' queries folded into
        its sequence axis (rows h * n + i, each head's mask rows repeated), in tiles of
        `ABSORBED_TILE` queries (the repeated mask grows as heads x tile x context).
        Returns `[H, n, r]`."""
        heads, n = query.shape[0], query.shape[1]
        latents = ctx.latents
        if n == 1:  # decode: the whole context, no mask
            return self._latent_sdpa(query, latents, None)
        tiles = []
        for a in range(0, n, ABSORBED_TILE):
            b = min(a + ABSORBED_TILE, n)
            keys = ctx.q_start + b
            mask = _causal(b - a, keys, latents.device, query.dtype).repeat(heads, 1)
            tiles.append(self._latent_sdpa(query[:, a:b], latents[:keys], mask))
        return tiles[0] if len(tiles) == 1 else torch.cat(tiles, dim=1)

    def _latent_sdpa(self, query: torch.Tensor, latents: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The values are the whole rows, their rope channels dropped from the output: with value
        and key head sizes equal SDPA keeps its flash kernel (a decode row over 8192 positions
        4.7 ms against 8.1 ms with the latent part alone as values, which takes the math kernel)."""
        heads, n = query.shape[0], query.shape[1]
        rows = latents[None, None]
        out = F.scaled_dot_product_attention(query.reshape(1, 1, heads * n, -1), rows, rows, attn_mask=mask,
                                             scale=self.scale)
        return out[..., : self.rank].reshape(heads, n, self.rank)

    def _expanded(self, q_nope: torch.Tensor, q_rope: torch.Tensor, ctx: LatentContext) -> torch.Tensor:
        """Per-head keys and values of the whole context, then SDPA (long prefill chunks).
        Returns `[H, n, dv]`."""
        latents = ctx.latents
        k_nope, values = self.kv_b_proj.expand(latents[:, : self.rank])
        k_rope = latents[None, :, self.rank :].expand(self.heads, -1, -1)
        keys = torch.cat((k_nope, k_rope), dim=-1)
        query = torch.cat((q_nope, q_rope), dim=-1)
        if values.shape[-1] != keys.shape[-1]:
            # SDPA's flash kernel needs one head size for q, k and v; otherwise it falls back to
            # the math kernel, which holds every score ([H, n, S]: 34 GB at 32k positions, 8 heads)
            # (zero channels change no dot product and no value: padded to the wider, sliced back)
            width = max(keys.shape[-1], values.shape[-1])
            query, keys, values = (F.pad(t, (0, width - t.shape[-1])) for t in (query, keys, values))
        if ctx.q_start == 0:
            out = F.scaled_dot_product_attention(query[None], keys[None], values[None], is_causal=True,
                                                 scale=self.scale)[0]
        else:
            mask = _causal(query.shape[1], latents.shape[0], latents.device, query.dtype)
            out = F.scaled_dot_product_attention(query[None], keys[None], values[None], attn_mask=mask,
                                                 scale=self.scale)[0]
        return out[..., : self.v_dim]
