"""GQA attention with the engine's sparse-attention contract, written here (the engine's other
modules cite it as "the sparse-attention contract, inference/layers/attention.py").

For a query at position t, window W and block size G:
- local keys are positions max(0, t-W+1) .. t;
- key nodes: for every complete block b (positions bG .. bG+G-1, all < t-W+1), the position whose
  layer-input hidden state (before the norm) has the largest L2 norm, earliest on ties; elected
  once, when its block completes, never changed (`LayerCache` of
  inference/layers/caches/gqa_sequence.py does the election);
- union mode: one softmax over local keys plus key nodes;
- routed mode: `p = softmax(router(x_t))` over (local, global, skip), where x_t is the normed
  layer input the projections also see; output = p_local * Attn(local) + p_global * Attn(nodes);
  skip adds nothing; a path whose weight is below `route_threshold` is not computed (its share
  is dropped, not renormalised), and an empty node set contributes nothing;
- with W >= the sequence length union mode is dense causal attention exactly (routed mode is then
  p_local times it).

Prefill runs chunked SDPA: queries in tiles of `QUERY_TILE`, each against the slice of local keys
its band can reach plus the nodes valid for its last query, under a boolean mask. Measured on this
2-core CPU at 16k tokens, 8 heads x 64, W=512, G=64: chunked SDPA 0.20 s, compiled FlexAttention
with the nodes gathered into a contiguous tail 0.35 s (kernel alone, the block mask prebuilt; plus
about 20 s of compile per shape), dense causal SDPA 1.05 s. Chunked SDPA is faster, needs no
compile, and the same code serves full prefill, chunked prefill and decode.
Decode (one query) needs no mask: the cache hands over exactly its window and valid nodes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from inference.config import ModelConfig
from inference.layers.linear import Linear, PackedLinear
from inference.layers.norm import RMSNorm
from inference.layers.rotary import apply_rotary_
from inference.layers.sparse_rules import nodes_seen_by, nodes_seen_from, window_start


@dataclass
class AttentionContext:
    """The keys and values that queries at positions `[q_start, q_start + L)` attend to.

    `keys[:, :num_local]` are local keys, `keys[:, num_local:]` the key nodes (node j is the one of
    block j; queries only see the nodes whose block lies fully left of their own window). Local
    keys are in position order starting at `local_start`; when `local_start` is None there is a
    single query and the local keys are exactly its window, in any order, so no mask is needed.
    """

    keys: torch.Tensor  # [kv_heads, S, head_dim]
    values: torch.Tensor
    num_local: int
    local_start: int | None
    q_start: int


QUERY_TILE = 256  # best of 128/256/512/1024 for the masked SDPA tiles on this CPU
# Chunks up to this many queries (speculative verify: k + 1 <= 9; MTP drafts) take the lean
# path: masks from a cache and skip decisions on the host, about 20 ops instead of 60 per call
# (a tiny model's speculative round is bound by op count, not arithmetic).
SMALL_CHUNK = 16


@functools.lru_cache(maxsize=256)
def _band_mask(queries: int, keys: int, offset: int, window: int, device: torch.device) -> torch.Tensor:
    """Local mask `[queries, keys]`: query i (at key index offset + i) sees keys in
    (offset + i - window, offset + i]. Cached: in steady decoding the arguments repeat."""
    qpos = torch.arange(offset, offset + queries, device=device)[:, None]
    kpos = torch.arange(keys, device=device)[None]
    return (kpos <= qpos) & (kpos > qpos - window)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask in SDPA's additive form (0 where seen, -inf elsewhere): the same result,
    while a boolean mask costs SDPA six more dispatches per call to convert it."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


@functools.lru_cache(maxsize=64)
def _right_band(queries: int, window: int, rep: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """`_band_mask` of the widest local context a chunk of `queries` can have (window + queries
    - 1 keys, the last query at the last key), its rows repeated `rep` times (the GQA fold), in
    additive form."""
    width = window + queries - 1
    mask = _band_mask(queries, width, width - queries, window, device)
    return _additive(mask.repeat(rep, 1) if rep > 1 else mask, dtype)


def _local_mask(queries: int, keys: int, window: int, rep: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The local mask of a chunk whose last query sits at the last of `keys` local keys, as a
    slice of a cached mask: the key count grows every step, so a mask cached by it would never be
    hit, and building one (plus its GQA repeat) is a dozen ops per layer per speculative step."""
    full = _right_band(queries, window, rep, device, dtype)
    return full[:, full.shape[1] - keys :]


@functools.lru_cache(maxsize=64)
def _node_mask(seen: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
    """Node mask `[queries, max(seen)]` (query i sees the first seen[i] nodes), additive; None
    when every query sees them all."""
    if all(c == seen[-1] for c in seen):
        return None
    seen_by = torch.arange(seen[-1], device=device)[None] < torch.tensor(seen, device=device)[:, None]
    return _additive(seen_by, dtype)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """SDPA on `[heads, L, D]`, given a batch axis: 3-D inputs fall back to the slow math kernel
    on CPU (4x slower measured, and dense causal materialises the full score matrix)."""
    return F.scaled_dot_product_attention(q[None], k[None], v[None], **kwargs)[0]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
            folded: bool = False) -> torch.Tensor:
    """SDPA for `q [Hq, L, D]` against GQA keys `[Hkv, S, D]`; `folded`: a small chunk's mask
    already has its rows repeated for the GQA fold (`_local_mask`)."""
    heads, kv_heads = q.shape[0], k.shape[0]
    rep = heads // kv_heads
    n = q.shape[1]
    if n == 1 and mask is None:
        # One query: fold each kv head's query group into its sequence axis, no key copies.
        return _sdpa(q.reshape(kv_heads, rep, -1), k, v).reshape(heads, 1, -1)
    if rep > 1 and n <= SMALL_CHUNK:
        # A few queries (speculative verify): the same fold, repeating the small mask rather
        # than copying every key and value `rep` times.
        mask = mask if mask is None or folded else mask.repeat(rep, 1)
        return _sdpa(q.reshape(kv_heads, rep * n, -1), k, v, attn_mask=mask).reshape(heads, n, -1)
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=0), v.repeat_interleave(rep, dim=0)
    return _sdpa(q, k, v, attn_mask=mask)


def _dense(q: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    n = q.shape[1]
    if n == 1:
        return _attend(q, ctx.keys, ctx.values, None)
    if ctx.q_start == 0:
        rep = q.shape[0] // ctx.keys.shape[0]
        k, v = ctx.keys.repeat_interleave(rep, 0), ctx.values.repeat_interleave(rep, 0)
        return _sdpa(q, k, v, is_causal=True)
    qpos = torch.arange(ctx.q_start, ctx.q_start + n, device=q.device)
    kpos = torch.arange(ctx.keys.shape[1], device=q.device)
    return _attend(q, ctx.keys, ctx.values, kpos[None] <= qpos[:, None])


def _mix_paths(
    q: torch.Tensor,
    paths: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]],
) -> torch.Tensor:
    """Sum of weight * Attn over paths `(keys, values, mask, weight [L])`, computing only the
    query rows whose weight passed the threshold (rows with weight 0 are skipped)."""
    out = torch.zeros_like(q)
    for keys, values, mask, weight in paths:
        rows = (weight > 0).nonzero().squeeze(1)
        if rows.numel() == 0 or keys.shape[1] == 0:
            continue
        if rows.numel() == q.shape[1]:
            part = _attend(q, keys, values, mask)
        else:
            part = _attend(q[:, rows], keys, values, None if mask is None else mask[rows])
        out[:, rows] += weight[rows, None].to(q.dtype) * part
    return out


def _mix_one(
    q: torch.Tensor, paths: list[tuple[torch.Tensor, torch.Tensor]], weights: torch.Tensor
) -> torch.Tensor:
    """`_mix_paths` for a single query (decode): the same sum in the same order, with the
    skip decisions made on the host instead of by masked row gathers (a dozen ops fewer)."""
    weights = weights.to(q.dtype)
    out = None
    for (keys, values), weight, on in zip(paths, weights, weights.tolist(), strict=True):
        if on <= 0 or keys.shape[1] == 0:
            continue
        part = weight * _attend(q, keys, values, None)
        out = part if out is None else out + part
    return torch.zeros_like(q) if out is None else out


def _small_chunk(
    q: torch.Tensor, ctx: AttentionContext, window: int, interval: int, gate: torch.Tensor | None
) -> torch.Tensor:
    """One tile of the loop in `sparse_attention`, the same masks and the same sums, with the
    masks cached and the row skipping of `_mix_paths` decided on the host."""
    n, device = q.shape[1], q.device
    rep = q.shape[0] // ctx.keys.shape[0]
    lo = max(ctx.local_start, window_start(ctx.q_start, window))
    keys = slice(lo - ctx.local_start, ctx.q_start + n - ctx.local_start)
    width = keys.stop - keys.start
    folded = _local_mask(n, width, window, rep, device, q.dtype)  # n <= SMALL_CHUNK here
    seen = nodes_seen_from(ctx.q_start, n, window, interval)
    count = seen[-1]
    local_k, local_v = ctx.keys[:, keys], ctx.values[:, keys]
    node_k = ctx.keys[:, ctx.num_local : ctx.num_local + count]
    node_v = ctx.values[:, ctx.num_local : ctx.num_local + count]
    node_mask = _node_mask(seen, device, q.dtype) if count else None
    if gate is None:
        if not count:
            return _attend(q, local_k, local_v, folded, folded=True)
        if node_mask is None:
            node_mask = torch.zeros(n, count, dtype=q.dtype, device=device)
        k, v = torch.cat((local_k, node_k), dim=1), torch.cat((local_v, node_v), dim=1)
        local_mask = _local_mask(n, width, window, 1, device, q.dtype)
        return _attend(q, k, v, torch.cat((local_mask, node_mask), dim=1))
    weights = gate.tolist()
    local_on = [w[0] > 0 for w in weights]
    node_on = [w[1] > 0 and c > 0 for w, c in zip(weights, seen, strict=True)]
    if not (all(local_on) and (all(node_on) or not any(node_on))):
        node_weight = torch.where(
            torch.tensor(seen, device=device) > 0, gate[:, 1], torch.zeros_like(gate[:, 1])
        )
        local_mask = _local_mask(n, width, window, 1, device, q.dtype)
        paths = [(local_k, local_v, local_mask, gate[:, 0]), (node_k, node_v, node_mask, node_weight)]
        return _mix_paths(q, paths)  # rows skipped: the general path
    gate = gate.to(q.dtype)
    out = gate[:, 0, None] * _attend(q, local_k, local_v, folded, folded=True)
    if any(node_on):
        out = out + gate[:, 1, None] * _attend(q, node_k, node_v, node_mask)
    return out


def sparse_attention(
    q: torch.Tensor,
    ctx: AttentionContext,
    window: int | None,
    interval: int | None,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of `q [Hq, L, D]` (positions `ctx.q_start ...`) under the contract above.

    `gate` (routed mode) is `[L, 2]`: the local and global weights with paths below the
    threshold already zeroed. Returns `[Hq, L, D]`.
    """
    if window is None:
        return _dense(q, ctx)
    local_k, local_v = ctx.keys[:, : ctx.num_local], ctx.values[:, : ctx.num_local]
    node_k, node_v = ctx.keys[:, ctx.num_local :], ctx.values[:, ctx.num_local :]
    if ctx.local_start is None:  # one query: the context is exactly its window and valid nodes
        if gate is None:
            return _attend(q, ctx.keys, ctx.values, None)
        return _mix_one(q, [(local_k, local_v), (node_k, node_v)], gate[0])
    if q.shape[1] <= SMALL_CHUNK:
        return _small_chunk(q, ctx, window, interval, gate)
    tiles = []
    for a in range(0, q.shape[1], QUERY_TILE):
        b = min(a + QUERY_TILE, q.shape[1])
        qpos = torch.arange(ctx.q_start + a, ctx.q_start + b, device=q.device)[:, None]
        lo = max(ctx.local_start, window_start(ctx.q_start + a, window))
        kpos = torch.arange(lo, ctx.q_start + b, device=q.device)[None]
        local_mask = (kpos <= qpos) & (kpos > qpos - window)
        keys = slice(lo - ctx.local_start, ctx.q_start + b - ctx.local_start)
        seen = nodes_seen_by(qpos[:, 0], window, interval)
        count = int(seen[-1])
        node_mask = torch.arange(count, device=q.device)[None] < seen[:, None]
        if gate is None:
            k = torch.cat((local_k[:, keys], node_k[:, :count]), dim=1)
            v = torch.cat((local_v[:, keys], node_v[:, :count]), dim=1)
            tiles.append(_attend(q[:, a:b], k, v, torch.cat((local_mask, node_mask), dim=1)))
        else:
            g = gate[a:b]
            node_weight = torch.where(seen > 0, g[:, 1], torch.zeros_like(g[:, 1]))
            paths = [
                (local_k[:, keys], local_v[:, keys], local_mask, g[:, 0]),
                (node_k[:, :count], node_v[:, :count], node_mask, node_weight),
            ]
            tiles.append(_mix_paths(q[:, a:b], paths))
    return torch.cat(tiles, dim=1)


class LayerKV(Protocol):
    """A layer's cache as its attention sees it: one sequence's (`LayerCache`,
    inference/layers/caches/gqa_sequence.py: `extend` stores the new keys and returns the context
    their queries read) or a paged step's (`attend`, inference/layers/caches/gqa.py: stores them
    and returns the attention output itself)."""


class Attention(nn.Module):
    """Projections, rotary and the (sparse) attention of one layer; state lives in the cache."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            d,
        )
        self.window, self.interval = config.sliding_window, config.global_interval
        parts = {"q_proj": self.num_heads * d, "k_proj": self.num_kv_heads * d, "v_proj": self.num_kv_heads * d}
        self.qkv_proj = PackedLinear(h, parts, bias=config.attention_bias)
        self.o_proj = Linear(self.num_heads * d, h)
        self.rotary_interleaved = config.rotary_interleaved
        self.q_norm = RMSNorm(d, config.rms_norm_eps) if config.use_qk_norm else None
        self.k_norm = RMSNorm(d, config.rms_norm_eps) if config.use_qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        rotations: torch.Tensor,
        cache: LayerKV,
        norms: torch.Tensor | None,
        gate: torch.Tensor | None = None,
        qkv: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`x [L, hidden]` normed input of the positions `[cache.length, cache.length + L)`;
        `norms [L]` the L2 norms of the un-normed layer input (sparse node election); `qkv`
        is `qkv_proj(x)` when the caller already has it."""
        n = x.shape[0]
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x) if qkv is None else qkv
        qkv = qkv.view(n, heads + 2 * kv_heads, self.head_dim)
        if self.q_norm is not None:
            qkv = torch.cat((self.q_norm(qkv[:, :heads]), self.k_norm(qkv[:, heads : heads + kv_heads]),
                             qkv[:, heads + kv_heads :]), dim=1)
        apply_rotary_(qkv[:, : heads + kv_heads], rotations, self.rotary_interleaved)  # q and k in one go
        q, k, v = qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        if hasattr(cache, "attend"):  # a batch of sequences on the paged cache (inference.engine)
            out = cache.attend(q, k, v, norms, gate)
        else:
            out = sparse_attention(q, cache.extend(k, v, norms), self.window, self.interval, gate)
        return self.o_proj(out.transpose(0, 1).reshape(n, self.num_heads * self.head_dim))
