"""Paged attention on CUDA for a whole batch in one launch a layer, reading the paged pools
through each sequence's slot list (Triton).

The torch path (`PagedGQALayer.attend`, `PagedMLALayer`, DSA's `_selected`) gathers each
sequence's keys with an index, concatenates them and calls SDPA, sequence after sequence, every
layer, every step: on a GPU that is hundreds of small launches and copies, launch-bound long
before it is bandwidth-bound. Here one program takes one sequence (and a group of heads), walks
its slot list in blocks, loads the rows from the pool where they lie and keeps an online softmax
in registers:

- `gqa_decode`: one query per sequence against `[kv_heads, slots, head_dim]` key/value pools;
  the query heads that share a kv head (GQA) are one program, so each key row is read once for
  all of them. The slot list is what the query attends to: every position (dense), or the
  sparse window's slots and then its key nodes' (slots of the node pools: "union" mode is one
  softmax over both; "routed" mode two calls, mixed by the router's weights).
- `latent_decode`: Multi-head Latent Attention's decode in latent space, one `[slots, rank + rope]`
  pool, each latent row read once for a block of heads; scores `q_nope . c + q_rope . k_rope`,
  values the row's first `rank`. The slot list is every position (GLM-4.7-Flash) or the chosen
  ones (GLM-5's DeepSeek Sparse Attention, the indexer's top-k mapped to slots).

- `gqa_prefill`: a step's prefill and chunked-prefill rows (and any decode rows beside them),
  causal, one launch a layer: a program takes a block of one sequence's queries and the heads
  of one kv head, walks that sequence's slots up to the block's last position, and masks each
  query to its own past. Dense models (no sparse window); the sparse window's prefill keeps
  the torch path.

Slot lists are `[batch, width]` int32/int64 with each sequence's length; entries past it are not
read. Triton comes with PyTorch's CUDA wheels; tests run the same programs on the CPU under
Triton's interpreter (`TRITON_INTERPRET=1`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

# "auto": CUDA tensors take the kernels; "0": never; "interpret": CPU tensors too, under
# TRITON_INTERPRET=1 (the tests run the engine's paged path through the programs that way)
MODE = os.environ.get("INFERENCE_TRITON_ATTENTION", "auto")
CALLS = {"gqa": 0, "latent": 0, "gqa_prefill": 0}  # launches so far (what the tests check was taken)


def _pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << (max(1, n) - 1).bit_length())


@functools.cache
def _kernels():
    """The jitted programs, made on first use; None without triton."""
    try:
        import triton.language as tl
        from triton import jit
    except ImportError:
        return None

    @jit
    def gqa_decode_kernel(q_ptr, k_ptr, v_ptr, k2_ptr, v2_ptr, slots_ptr, lengths_ptr, split_ptr, out_ptr, scale,
                          stride_qb, stride_qh, stride_kh, stride_ks, stride_k2h, stride_k2s, stride_sb,
                          stride_ob, stride_oh,
                          GROUP: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                          BLOCK_N: tl.constexpr):
        b, kv = tl.program_id(0), tl.program_id(1)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        heads = kv * GROUP + g
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                    mask=(g[:, None] < GROUP) & (d[None, :] < D), other=0.0)
        length = tl.load(lengths_ptr + b)
        split = tl.load(split_ptr + b)  # entries before it are slots of the first pools, after it of the second
        top = tl.full((BLOCK_G,), float("-inf"), tl.float32)
        total = tl.zeros((BLOCK_G,), tl.float32)
        acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
        for start in range(0, length, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            live = n < length
            first = n < split
            slot = tl.load(slots_ptr + b * stride_sb + n, mask=live, other=0).to(tl.int64)
            keep1 = (live & first)[:, None] & (d[None, :] < D)
            keep2 = (live & (n >= split))[:, None] & (d[None, :] < D)
            rows1 = kv * stride_kh + slot[:, None] * stride_ks + d[None, :]
            rows2 = kv * stride_k2h + slot[:, None] * stride_k2s + d[None, :]
            k = tl.load(k_ptr + rows1, mask=keep1, other=0.0) + tl.load(k2_ptr + rows2, mask=keep2, other=0.0)
            v = tl.load(v_ptr + rows1, mask=keep1, other=0.0) + tl.load(v2_ptr + rows2, mask=keep2, other=0.0)
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale  # [BLOCK_G, BLOCK_N]
            s = tl.where(live[None, :], s, float("-inf"))
            new_top = tl.maximum(top, tl.max(s, axis=1))
            p = tl.exp(s - new_top[:, None])
            fix = tl.exp(top - new_top)
            total = total * fix + tl.sum(p, axis=1)
            acc = acc * fix[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            top = new_top
        out = acc / tl.where(total > 0, total, 1.0)[:, None]
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=(g[:, None] < GROUP) & (d[None, :] < D))

    @jit
    def latent_decode_kernel(q_ptr, pool_ptr, slots_ptr, lengths_ptr, out_ptr, scale, H,
                             stride_qb, stride_qh, stride_ps, stride_sb, stride_ob, stride_oh,
                             R: tl.constexpr, DR: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
                             BLOCK_DR: tl.constexpr, BLOCK_N: tl.constexpr):
        b, hb = tl.program_id(0), tl.program_id(1)
        h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        r = tl.arange(0, BLOCK_R)
        e = tl.arange(0, BLOCK_DR)
        head_ok = h < H
        q_nope = tl.load(q_ptr + b * stride_qb + h[:, None] * stride_qh + r[None, :],
                         mask=head_ok[:, None] & (r[None, :] < R), other=0.0)
        q_rope = tl.load(q_ptr + b * stride_qb + h[:, None] * stride_qh + R + e[None, :],
                         mask=head_ok[:, None] & (e[None, :] < DR), other=0.0)
        length = tl.load(lengths_ptr + b)
        top = tl.full((BLOCK_H,), float("-inf"), tl.float32)
        total = tl.zeros((BLOCK_H,), tl.float32)
        acc = tl.zeros((BLOCK_H, BLOCK_R), tl.float32)
        for start in range(0, length, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            live = n < length
            slot = tl.load(slots_ptr + b * stride_sb + n, mask=live, other=0).to(tl.int64)
            c = tl.load(pool_ptr + slot[:, None] * stride_ps + r[None, :],
                        mask=live[:, None] & (r[None, :] < R), other=0.0)  # [BLOCK_N, BLOCK_R]
            k_rope = tl.load(pool_ptr + slot[:, None] * stride_ps + R + e[None, :],
                             mask=live[:, None] & (e[None, :] < DR), other=0.0)
            s = (tl.dot(q_nope, tl.trans(c)) + tl.dot(q_rope, tl.trans(k_rope))).to(tl.float32) * scale
            s = tl.where(live[None, :], s, float("-inf"))
            new_top = tl.maximum(top, tl.max(s, axis=1))
            p = tl.exp(s - new_top[:, None])
            fix = tl.exp(top - new_top)
            total = total * fix + tl.sum(p, axis=1)
            acc = acc * fix[:, None] + tl.dot(p.to(c.dtype), c).to(tl.float32)
            top = new_top
        out = acc / tl.where(total > 0, total, 1.0)[:, None]
        tl.store(out_ptr + b * stride_ob + h[:, None] * stride_oh + r[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=head_ok[:, None] & (r[None, :] < R))

    @jit
    def gqa_prefill_kernel(q_ptr, k_ptr, v_ptr, slots_ptr, block_seq_ptr, block_first_ptr, rows_ptr, starts_ptr,
                           news_ptr, out_ptr, scale, stride_qt, stride_qh, stride_kh, stride_ks, stride_sb,
                           stride_ot, stride_oh,
                           GROUP: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        blk, kv = tl.program_id(0), tl.program_id(1)
        b = tl.load(block_seq_ptr + blk)  # the sequence this block of queries belongs to
        m0 = tl.load(block_first_ptr + blk)  # its first query, counted in the sequence's new rows
        row0 = tl.load(rows_ptr + b)  # the sequence's first row in the step
        start = tl.load(starts_ptr + b)  # the position of that row
        num_new = tl.load(news_ptr + b)
        i = tl.arange(0, BLOCK_M * BLOCK_G)  # a query's heads of this kv head, query after query
        m, g = i // BLOCK_G, i % BLOCK_G
        d = tl.arange(0, BLOCK_D)
        valid = (g < GROUP) & (m0 + m < num_new)
        position = start + m0 + m
        row = (row0 + m0 + m).to(tl.int64)
        heads = kv * GROUP + g
        q = tl.load(q_ptr + row[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
                    mask=valid[:, None] & (d[None, :] < D), other=0.0)
        end = start + tl.minimum(m0 + BLOCK_M, num_new)  # one past the block's last position
        top = tl.full((BLOCK_M * BLOCK_G,), float("-inf"), tl.float32)
        total = tl.zeros((BLOCK_M * BLOCK_G,), tl.float32)
        acc = tl.zeros((BLOCK_M * BLOCK_G, BLOCK_D), tl.float32)
        for first in range(0, end, BLOCK_N):  # key 0 is in every query's past: no row stays empty
            n = first + tl.arange(0, BLOCK_N)
            live = n < end
            slot = tl.load(slots_ptr + b * stride_sb + n, mask=live, other=0).to(tl.int64)
            keep = live[:, None] & (d[None, :] < D)
            rows = kv * stride_kh + slot[:, None] * stride_ks + d[None, :]
            k = tl.load(k_ptr + rows, mask=keep, other=0.0)
            v = tl.load(v_ptr + rows, mask=keep, other=0.0)
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale  # [BLOCK_M * BLOCK_G, BLOCK_N]
            s = tl.where(live[None, :] & (n[None, :] <= position[:, None]), s, float("-inf"))
            new_top = tl.maximum(top, tl.max(s, axis=1))
            p = tl.exp(s - new_top[:, None])
            fix = tl.exp(top - new_top)
            total = total * fix + tl.sum(p, axis=1)
            acc = acc * fix[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            top = new_top
        out = acc / tl.where(total > 0, total, 1.0)[:, None]
        tl.store(out_ptr + row[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=valid[:, None] & (d[None, :] < D))

    return gqa_decode_kernel, latent_decode_kernel, gqa_prefill_kernel


def available() -> bool:
    return _kernels() is not None


def wanted(device: torch.device) -> bool:
    """Whether a step on `device` decodes through the kernels. Never imports triton for a CPU
    tensor unless told to interpret."""
    if MODE == "0" or (device.type != "cuda" and MODE != "interpret"):
        return False
    return available()


def gqa_decode(q: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, slots: torch.Tensor,
               lengths: torch.Tensor, scale: float | None = None, block_n: int = 64,
               second: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """`q [B, Hq, D]` (one query a sequence) against the slots `slots [B, W]` (the first
    `lengths[b]` of row b) of `pool_k`/`pool_v [Hkv, S, D]`: `[B, Hq, D]`. `second`: another
    pair of pools `(k2, v2)` and a per-sequence `split [B]`: a row's entries from `split[b]` on
    are slots of those (the sparse window's key nodes, kept in their own pools), one softmax
    over both."""
    batch, heads, dim = q.shape
    kv_heads = pool_k.shape[0]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not share {kv_heads} kv heads evenly")
    group = heads // kv_heads
    q, slots, lengths = q.contiguous(), slots.contiguous(), lengths.to(torch.int32).contiguous()
    k2, v2, split = second if second is not None else (pool_k, pool_v, lengths)
    split = split.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    kernel = _kernels()[0]
    CALLS["gqa"] += 1
    kernel[(batch, kv_heads)](
        q, pool_k, pool_v, k2, v2, slots, lengths, split, out, scale if scale is not None else dim**-0.5,
        q.stride(0), q.stride(1), pool_k.stride(0), pool_k.stride(1), k2.stride(0), k2.stride(1), slots.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, D=dim, BLOCK_G=_pow2(group), BLOCK_D=_pow2(dim), BLOCK_N=block_n)
    return out


def latent_decode(q: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor, rank: int,
                  scale: float, block_h: int = 16, block_n: int = 32) -> torch.Tensor:
    """MLA decode: `q [B, H, rank + rope]` (`kv_b_proj` absorbed into its first `rank`) against
    the latent rows `pool[slots[b, :lengths[b]]]` of `pool [S, rank + rope]`: `[B, H, rank]`,
    the attention-weighted latent rows (for `kv_b_proj`'s value half)."""
    batch, heads, width = q.shape
    rope = width - rank
    q, slots, lengths = q.contiguous(), slots.contiguous(), lengths.to(torch.int32).contiguous()
    out = q.new_empty(batch, heads, rank)
    kernel = _kernels()[1]
    CALLS["latent"] += 1
    kernel[(batch, -(-heads // block_h))](
        q, pool, slots, lengths, out, scale, heads,
        q.stride(0), q.stride(1), pool.stride(0), slots.stride(0), out.stride(0), out.stride(1),
        R=rank, DR=rope, BLOCK_H=block_h, BLOCK_R=_pow2(rank), BLOCK_DR=_pow2(rope), BLOCK_N=block_n)
    return out


PREFILL_BLOCK_M = 16  # queries a program takes (times the heads sharing a kv head)


@dataclass
class PrefillPlan:
    """Where a step's query rows lie for `gqa_prefill`: each sequence's slot list (every
    position up to its last new one) and its rows, and the blocks of `PREFILL_BLOCK_M` queries
    the launch's programs take (a block never spans two sequences). Made once a step."""

    slots: torch.Tensor  # [B, W] each sequence's slots, position order
    rows: torch.Tensor  # [B] its first row in the step
    starts: torch.Tensor  # [B] the position of that row
    news: torch.Tensor  # [B] its rows this step
    block_seq: torch.Tensor  # [blocks] the sequence of each block
    block_first: torch.Tensor  # [blocks] the block's first query among its sequence's rows

    @classmethod
    def build(cls, slot_lists: list[torch.Tensor], starts: list[int], news: list[int],
              device: torch.device) -> PrefillPlan:
        width = max(1, max(len(x) for x in slot_lists))
        slots = torch.zeros(len(slot_lists), width, dtype=torch.long)
        for b, row in enumerate(slot_lists):
            slots[b, : len(row)] = row
        rows, block_seq, block_first, a = [], [], [], 0
        for b, n in enumerate(news):
            rows.append(a)
            firsts = range(0, n, PREFILL_BLOCK_M)
            block_seq += [b] * len(firsts)
            block_first += list(firsts)
            a += n
        as_tensor = functools.partial(torch.tensor, dtype=torch.int32, device=device)
        return cls(slots.to(device), as_tensor(rows), as_tensor(starts), as_tensor(news), as_tensor(block_seq),
                   as_tensor(block_first))


def gqa_prefill(q: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, plan: PrefillPlan,
                scale: float | None = None, block_n: int = 32) -> torch.Tensor:
    """Causal attention for a whole step's rows in one launch: `q [T, Hq, D]`, each sequence's
    rows one after another (a prefill, a chunk of one after its cached prefix, or one decode row),
    against `pool_k`/`pool_v [Hkv, S, D]` read through each sequence's slots (`plan`, whose new
    rows' keys are already written). Row t of sequence b attends to b's positions up to its own.
    Returns `[T, Hq, D]`."""
    tokens, heads, dim = q.shape
    kv_heads = pool_k.shape[0]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not share {kv_heads} kv heads evenly")
    group = heads // kv_heads
    if q.stride(2) != 1:
        q = q.contiguous()
    out = q.new_empty(tokens, heads, dim)
    kernel = _kernels()[2]
    CALLS["gqa_prefill"] += 1
    block_g = _pow2(group, least=1)
    kernel[(plan.block_seq.numel(), kv_heads)](
        q, pool_k, pool_v, plan.slots, plan.block_seq, plan.block_first, plan.rows, plan.starts, plan.news, out,
        scale if scale is not None else dim**-0.5,
        q.stride(0), q.stride(1), pool_k.stride(0), pool_k.stride(1), plan.slots.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, D=dim, BLOCK_G=block_g, BLOCK_D=_pow2(dim), BLOCK_M=PREFILL_BLOCK_M, BLOCK_N=block_n)
    return out
