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
  ones (GLM-5's DeepSeek Sparse Attention, the indexer's top-k mapped to slots; in a prefill or
  a chunk, a row per query, each with its own chosen slots).

- `gqa_prefill`: a step's prefill and chunked-prefill rows (and any decode rows beside them),
  one launch a layer: a program takes a block of one sequence's queries and the heads of one kv
  head, walks that sequence's slots from the block's first window start (or position 0) to its
  last position, masking each query to its own past (and window), then, with a sparse window,
  the sequence's key nodes, each query its valid ones: one softmax with the window's (union) or
  one of their own, mixed by the router's weights (routed).

Slot lists are `[batch, width]` int32/int64 with each sequence's length; entries past it are not
read. Dense decode (GQA without a window, MLA) passes the rows' block tables instead (`page`, the
block size): position n lies in slot `table[n // page] * page + n % page`, so a step copies each
sequence's table, not a slot a position. Triton comes with PyTorch's CUDA wheels; tests run the
same programs on the CPU under Triton's interpreter (`TRITON_INTERPRET=1`).
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
    """The jitted programs (inference/layers/kernels/paged_attention_programs.py), imported on first
    use; None without triton."""
    try:
        from inference.layers.kernels import paged_attention_programs as programs
    except ImportError:
        return None
    return programs.gqa_decode_kernel, programs.latent_decode_kernel, programs.gqa_prefill_kernel


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
               second: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
               page: int = 0, firsts: torch.Tensor | None = None,
               node_pages: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
    """`q [B, Hq, D]` (one query a sequence) against the slots `slots [B, W]` (the first
    `lengths[b]` of row b) of `pool_k`/`pool_v [Hkv, S, D]`: `[B, Hq, D]`. `second`: another
    pair of pools `(k2, v2)` and a per-sequence `split [B]`: a row's entries from `split[b]` on
    are slots of those (the sparse window's key nodes, kept in their own pools), one softmax
    over both. `page` (a block size): `slots` are the rows' block tables instead, row b's entry
    n (before its split) position `firsts[b] + n` (default 0: dense attention, every position);
    with `second` its entries from the split on are key nodes 0, 1, ... read through the node
    page tables `node_pages = (pages [B, P], node page size)`."""
    if page and second is not None and node_pages is None:
        raise ValueError("rows read through block tables find their key nodes through node page tables")
    batch, heads, dim = q.shape
    kv_heads = pool_k.shape[0]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not share {kv_heads} kv heads evenly")
    group = heads // kv_heads
    q, slots, lengths = q.contiguous(), slots.contiguous(), lengths.to(torch.int32).contiguous()
    k2, v2, split = second if second is not None else (pool_k, pool_v, lengths)
    split = split.to(torch.int32).contiguous()
    firsts = torch.zeros_like(lengths) if firsts is None else firsts.to(torch.int32).contiguous()
    pages, node_page = node_pages if node_pages is not None else (slots, 0)
    pages = pages.contiguous()
    out = torch.empty_like(q)
    kernel = _kernels()[0]
    CALLS["gqa"] += 1
    kernel[(batch, kv_heads)](
        q, pool_k, pool_v, k2, v2, slots, lengths, split, firsts, pages, out,
        scale if scale is not None else dim**-0.5,
        q.stride(0), q.stride(1), pool_k.stride(0), pool_k.stride(1), k2.stride(0), k2.stride(1), slots.stride(0),
        pages.stride(0), out.stride(0), out.stride(1),
        GROUP=group, D=dim, BLOCK_G=_pow2(group), BLOCK_D=_pow2(dim), BLOCK_N=block_n, PAGE=page,
        NODE_PAGE=node_page)
    return out


def latent_decode(q: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor, rank: int,
                  scale: float, block_h: int = 16, block_n: int = 32,
                  table_rows: torch.Tensor | None = None, page: int = 0) -> torch.Tensor:
    """MLA in latent space, one query row at a time: `q [B, H, rank + rope]` (`kv_b_proj`
    absorbed into its first `rank`) against the latent rows `pool[slots[b, :lengths[b]]]` of
    `pool [S, rank + rope]`: `[B, H, rank]`, the attention-weighted latent rows (for
    `kv_b_proj`'s value half). `table_rows [B]`: row b reads slot list `slots[table_rows[b]]`
    instead of its own (a chunk's queries share their sequence's list, each reading its own
    position + 1 of it). `page` (a block size): `slots` are block tables, entry n position n
    (dense MLA reads its positions `[0, lengths[b])` so; DSA's chosen rows come as slot lists)."""
    batch, heads, width = q.shape
    rope = width - rank
    q, slots, lengths = q.contiguous(), slots.contiguous(), lengths.to(torch.int32).contiguous()
    if table_rows is None:
        table_rows = torch.arange(batch, dtype=torch.int32, device=q.device)
    out = q.new_empty(batch, heads, rank)
    kernel = _kernels()[1]
    CALLS["latent"] += 1
    kernel[(batch, -(-heads // block_h))](
        q, pool, slots, table_rows.to(torch.int32).contiguous(), lengths, out, scale, heads,
        q.stride(0), q.stride(1), pool.stride(0), slots.stride(0), out.stride(0), out.stride(1),
        R=rank, DR=rope, BLOCK_H=block_h, BLOCK_R=_pow2(rank), BLOCK_DR=_pow2(rope), BLOCK_N=block_n, PAGE=page)
    return out


PREFILL_BLOCK_M = 16  # queries a program takes (times the heads sharing a kv head); at most block_n


@dataclass
class PrefillPlan:
    """Where a step's query rows lie for `gqa_prefill`: each sequence's slot list (from its first
    query's window start, or position 0, up to its last new position), its key nodes' slots
    (the sparse window's; those valid for its last query) and its rows, and the blocks of
    `PREFILL_BLOCK_M` queries the launch's programs take (a block never spans two sequences).
    With `page` (the block size) `slots` are the sequences' block tables instead (position p in
    slot `table[p // page] * page + p % page`), and with `node_page` `node_slots` their node page
    tables (node j in `pages[j // node_page] * node_page + j % node_page`): what the engine
    passes, so that a step copies tables, not a slot a position. Made once a step, shared by
    every layer."""

    slots: torch.Tensor  # [B, W] each sequence's slots, position order (or its block table)
    local_starts: torch.Tensor  # [B] the position of its first slot (its first query's window start)
    node_slots: torch.Tensor  # [B, N] its key nodes' slots in the node pools, or node page table (unread without a window)
    rows: torch.Tensor  # [B] its first row in the step
    starts: torch.Tensor  # [B] the position of that row
    news: torch.Tensor  # [B] its rows this step
    block_seq: torch.Tensor  # [blocks] the sequence of each block
    block_first: torch.Tensor  # [blocks] the block's first query among its sequence's rows
    page: int = 0
    node_page: int = 0

    @classmethod
    def build(cls, slot_lists: list[torch.Tensor], local_starts: list[int], starts: list[int], news: list[int],
              device: torch.device, node_lists: list[torch.Tensor] | None = None, page: int = 0,
              node_page: int = 0) -> PrefillPlan:
        rows, block_seq, block_first, a = [], [], [], 0
        for b, n in enumerate(news):
            rows.append(a)
            firsts = range(0, n, PREFILL_BLOCK_M)
            block_seq += [b] * len(firsts)
            block_first += list(firsts)
            a += n
        as_tensor = functools.partial(torch.tensor, dtype=torch.int32, device=device)
        pad = functools.partial(torch.nn.utils.rnn.pad_sequence, batch_first=True)
        nodes = pad(node_lists or [torch.empty(0, dtype=torch.long, device=device)]).to(device)
        return cls(pad(slot_lists).to(device), as_tensor(local_starts), nodes, as_tensor(rows), as_tensor(starts),
                   as_tensor(news), as_tensor(block_seq), as_tensor(block_first), page, node_page)


def gqa_prefill(q: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, plan: PrefillPlan,
                scale: float | None = None, block_n: int = 32, window: int | None = None,
                interval: int | None = None, nodes: tuple[torch.Tensor, torch.Tensor] | None = None,
                gate: torch.Tensor | None = None) -> torch.Tensor:
    """Attention for a whole step's rows in one launch: `q [T, Hq, D]`, each sequence's rows
    one after another (a prefill, a chunk of one after its cached prefix, or one decode row),
    against `pool_k`/`pool_v [Hkv, S, D]` read through each sequence's slots (`plan`; the new
    rows' keys are already written). Dense: row t of sequence b attends to b's positions up to
    its own. With a sparse `window` and `interval` (the contract of inference/layers/attention.py):
    to its window, and to its valid key nodes in `nodes = (node_k, node_v)` pools, one softmax
    (union) or, with `gate [T, 2]` (routed, thresholded), `gate[:, 0] * Attn(window) +
    gate[:, 1] * Attn(nodes)`. Returns `[T, Hq, D]`."""
    tokens, heads, dim = q.shape
    kv_heads = pool_k.shape[0]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not share {kv_heads} kv heads evenly")
    if window is not None and (interval is None or nodes is None):
        raise ValueError("a sparse window needs its interval and the node pools")
    if block_n < PREFILL_BLOCK_M:
        raise ValueError("a block of queries must not be longer than a block of keys")
    group = heads // kv_heads
    if q.stride(2) != 1:
        q = q.contiguous()
    node_k, node_v = nodes if nodes is not None else (pool_k, pool_v)
    gate = gate.contiguous() if gate is not None else q  # unread when not routed
    out = q.new_empty(tokens, heads, dim)
    kernel = _kernels()[2]
    CALLS["gqa_prefill"] += 1
    kernel[(plan.block_seq.numel(), kv_heads)](
        q, pool_k, pool_v, node_k, node_v, plan.slots, plan.node_slots, gate, plan.block_seq, plan.block_first,
        plan.rows, plan.starts, plan.news, plan.local_starts, out, scale if scale is not None else dim**-0.5,
        q.stride(0), q.stride(1), pool_k.stride(0), pool_k.stride(1), node_k.stride(0), node_k.stride(1),
        plan.slots.stride(0), plan.node_slots.stride(0), out.stride(0), out.stride(1),
        GROUP=group, D=dim, BLOCK_G=_pow2(group, least=1), BLOCK_D=_pow2(dim), BLOCK_M=PREFILL_BLOCK_M,
        BLOCK_N=block_n, WINDOW=window or 0, INTERVAL=interval or 1, ROUTED=gate is not q, PAGE=plan.page,
        NODE_PAGE=plan.node_page)
    return out
