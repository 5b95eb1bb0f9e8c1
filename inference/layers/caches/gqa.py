"""The cache of GQA attention: per layer and position, `num_key_value_heads` keys and values of
`head_dim`; sparse (a window plus key nodes, the contract in inference/layers/attention.py) when the
config has a `sliding_window`.

`GQALayout` is what the engine asks (inference/layers/caches/layouts.py): one sequence's layer
cache (`LayerCache`, gqa_sequence.py), the paged pools (`PagedGQACache`) and their bytes. Each step
the pools make a `GQAStep` from the runner's slot tables: per sequence the slots of its window
and, when sparse, the node-page tables (the intervals the step completes, where their nodes go,
the nodes its last query sees). Its `layers[i].attend` is what `Attention.forward` calls: it
writes the new keys, values and norms into their slots, elects the key nodes of every interval
the step completes (copied into the sequence's node page), then for each sequence gathers its
window and its valid nodes from the pools into the same `AttentionContext` one sequence's
`LayerCache` makes and calls the same `sparse_attention` (SDPA), so both paths give the same
numbers. `JoinedLayerCaches` does the same over several sequences' own `LayerCache`s (the
engine's batched MTP drafts).
"""

from __future__ import annotations

import functools

import torch

from inference.config import ModelConfig
from inference.layers.attention import AttentionContext, sparse_attention
from inference.layers.caches.gqa_sequence import LayerCache
from inference.layers.caches.paged_slots import SequenceSlots, page_slots
from inference.layers.kernels import paged_decode_triton
from inference.layers.sparse_rules import blocks_completed, elect, nodes_seen, window_start


class GQALayout:
    """Sizes and builds GQA caches for a config (its decoder layers; MTP layers keep
    single-sequence caches)."""

    def __init__(self, config: ModelConfig) -> None:
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads, self.head_dim = config.num_key_value_heads, config.head_dim
        self.window, self.interval = config.sliding_window, config.global_interval

    def layer_cache(self, dtype: torch.dtype, device: torch.device, max_positions: int | None = None) -> LayerCache:
        return LayerCache(self.num_kv_heads, self.head_dim, self.window, self.interval, dtype, device,
                          max_positions)

    def layer_cache_bytes(self, dtype: torch.dtype, positions: int) -> int:
        return LayerCache.bytes_when_full(self.num_kv_heads, self.head_dim, self.window, self.interval,
                                          dtype, positions)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """One position slot of the pools, all layers: its key and value and, when sparse, its
        norm and its share of node slots (as many node slots as position slots: `node_pages`)."""
        kv = 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype.itemsize
        if self.window is None:
            return kv
        return kv + self.num_layers * 4 + kv  # norms, and G node pages of B/G nodes a block = kv again

    def bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        return block_size * self.bytes_per_token(dtype)

    def node_pages(self, num_blocks: int) -> int:
        """Node pages of `block_size / G` nodes beside `num_blocks` position blocks (sparse):
        `global_interval` per position block, since a sequence keeps a node page for every block
        of its length but position blocks only for its window."""
        return num_blocks * self.interval if self.window is not None else 0

    def longest_sequence(self, num_blocks: int, block_size: int) -> int:
        """The longest sequence pools of `num_blocks` hold on their own (sparse: the window's
        blocks plus a node page per block of the sequence)."""
        if self.window is None:
            return num_blocks * block_size
        window_blocks = self.window // block_size + 2
        return num_blocks * block_size * self.interval if num_blocks >= window_blocks else 0

    def paged_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype,
                    device: torch.device) -> PagedGQACache:
        return PagedGQACache(self, num_blocks, block_size, dtype, device)

    def joined_layer_caches(self, caches: list[LayerCache], lengths: list[int]) -> JoinedLayerCaches:
        return JoinedLayerCaches(caches, lengths, self.window, self.interval)


class PagedGQACache:
    """The pools: per layer, keys/values of `num_blocks * block_size` position slots as
    `[kv_heads, slots, head_dim]` (the `LayerCache` layout) and, when sparse, the norms of those
    slots and `num_node_pages * block_size / G` node slots."""

    def __init__(self, layout: GQALayout, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        layers, heads, dim = layout.num_layers, layout.num_kv_heads, layout.head_dim
        slots = num_blocks * block_size
        self.layout, self.device = layout, device
        self.num_blocks, self.block_size = num_blocks, block_size
        self.k = torch.zeros(layers, heads, slots, dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.num_node_pages = layout.node_pages(num_blocks)
        if layout.window is not None:
            self.page_size = block_size // layout.interval
            node_slots = self.num_node_pages * self.page_size
            self.norms = torch.zeros(layers, slots, device=device)
            self.node_k = torch.zeros(layers, heads, node_slots, dim, dtype=dtype, device=device)
            self.node_v = torch.zeros_like(self.node_k)

    def step(self, rows: list[SequenceSlots]) -> GQAStep:
        return GQAStep(self, rows)


class SeqPlan:
    """One sequence's part of a `GQAStep`: what its queries read. Its local slots (in position
    order, from its first query's window start or position 0) are made on first use: a dense
    decode step on CUDA reads the sequence's block table instead."""

    def __init__(self, row: SequenceSlots, lo: int, local_start: int | None, node_slots: torch.Tensor | None,
                 device: torch.device) -> None:
        self.start, self.num_new = row.start, row.num_new  # positions computed this step
        self.local_start = local_start  # None: one query, the context is exactly its window
        self.node_slots = node_slots  # node slots of the nodes valid for its last query
        self._row, self._lo, self._device = row, lo, device

    @functools.cached_property
    def local_slots(self) -> torch.Tensor:
        return self._row.slots(self._lo, self.start + self.num_new).to(self._device)


class GQAStep:
    """One step on the pools, standing in for `KVCache` in the model's forward: the slots of the
    step (worked out once, shared by every layer) and one `PagedGQALayer` per decoder layer."""

    def __init__(self, cache: PagedGQACache, rows: list[SequenceSlots]) -> None:
        layout, device = cache.layout, cache.device
        window, interval = layout.window, layout.interval
        write, elect_slots, targets, self.seqs, node_pages = [], [], [], [], []
        for row in rows:
            c, n = row.start, row.num_new
            lo = 0 if window is None else window_start(c, window)
            nodes = None
            if window is not None:
                pages = torch.tensor(row.seq.node_table, dtype=torch.long)
                node_pages.append(pages)
                completed = blocks_completed(c, n, interval)
                if completed:
                    first, end = completed.start, completed.stop
                    elect_slots.append(row.slots(first * interval, end * interval).view(-1, interval))
                    targets.append(page_slots(pages, cache.page_size, first, end))
                nodes = page_slots(pages, cache.page_size, 0, nodes_seen(c + n - 1, window, interval))
            local_start = None if n == 1 and window is not None else lo
            write.append(row.slots(c, c + n))  # the new positions end the window
            self.seqs.append(SeqPlan(row, lo, local_start, None if nodes is None else nodes.to(device), device))
        self.write_slots = torch.cat(write).to(device)
        # A decode-only step on CUDA: one launch a layer for the batch. Dense: each row reads its
        # positions through its block table; sparse: every query's slot list (its window, then
        # its valid key nodes) in one padded table (routed mode: the window's and the nodes'
        # lists apart, each its own softmax)
        self.decode_table = self.local_table = self.node_table = self.decode_firsts = self.node_pages = None
        self.decode_page = 0
        if all(sp.num_new == 1 for sp in self.seqs) and paged_decode_triton.wanted(device):
            tables = torch.nn.utils.rnn.pad_sequence([row.table for row in rows], batch_first=True).to(device)
            self.decode_page = cache.block_size
            if window is None:
                lengths = torch.tensor([row.start + 1 for row in rows], device=device)
                self.decode_table, self.decode_split = (tables, lengths), lengths
            else:  # the window's positions from its start, then the valid key nodes
                firsts = [window_start(row.start, window) for row in rows]
                local = torch.tensor([row.start + 1 - lo for row, lo in zip(rows, firsts, strict=True)])
                seen = torch.tensor([nodes_seen(row.start, window, interval) for row in rows])
                pages = torch.nn.utils.rnn.pad_sequence(node_pages, batch_first=True).to(device)
                self.decode_firsts = torch.tensor(firsts, device=device)
                self.node_pages = (pages, cache.page_size)
                self.decode_table, self.decode_split = ((tables, (local + seen).to(device)), local.to(device))
                self.local_table, self.node_table = (tables, local.to(device)), (pages, seen.to(device))
        # Any other step on CUDA (prefills, chunks, decode rows beside them): one launch a layer
        # over every sequence's rows, its window and key nodes where the model has them, read
        # through its block table and node page table
        self.prefill_plan = None
        if self.decode_table is None and paged_decode_triton.wanted(device):
            self.prefill_plan = paged_decode_triton.PrefillPlan.build(
                [row.table for row in rows],
                [0 if window is None else window_start(sp.start, window) for sp in self.seqs],
                [sp.start for sp in self.seqs], [sp.num_new for sp in self.seqs], device,
                None if window is None else node_pages, page=cache.block_size,
                node_page=0 if window is None else cache.page_size)
        self.elect_slots = torch.cat(elect_slots).to(device) if elect_slots else None
        self.node_targets = torch.cat(targets).to(device) if targets else None
        self.layers = [PagedGQALayer(cache, i, self) for i in range(layout.num_layers)]

    @classmethod
    def decode_only(cls, cache: PagedGQACache, write_slots: torch.Tensor, tables: torch.Tensor,
                    lengths: torch.Tensor) -> GQAStep:
        """A decode step of dense GQA made from device tensors alone (what a CUDA graph replays,
        inference/engine/cuda_graphs.py): row b writes `write_slots[b]` and reads its positions
        `[0, lengths[b])` through its block table `tables[b]`."""
        if cache.layout.window is not None:
            raise ValueError("a sparse window's decode elects key nodes: it has no static step")
        step = cls.__new__(cls)
        step.seqs, step.write_slots = [], write_slots
        step.decode_table, step.decode_split, step.decode_page = (tables, lengths), lengths, cache.block_size
        step.local_table = step.node_table = step.prefill_plan = step.elect_slots = step.node_targets = None
        step.decode_firsts = step.node_pages = None
        step.layers = [PagedGQALayer(cache, i, step) for i in range(cache.layout.num_layers)]
        return step


class PagedGQALayer:
    """What one attention layer sees of the batch (`Attention.forward` calls `attend`)."""

    def __init__(self, cache: PagedGQACache, layer: int, plan: GQAStep) -> None:
        self.cache, self.layer, self.plan = cache, layer, plan
        self.window, self.interval = cache.layout.window, cache.layout.interval

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, norms: torch.Tensor | None,
               gate: torch.Tensor | None) -> torch.Tensor:
        """`q [Hq, T, D]`, `k`/`v [Hkv, T, D]`, `norms [T]`, `gate [T, 2]` for the T tokens of
        the step, sequence after sequence; returns `[Hq, T, D]`."""
        plan, layer = self.plan, self.layer
        pool_k, pool_v = self.cache.k[layer], self.cache.v[layer]
        pool_k[:, plan.write_slots] = k
        pool_v[:, plan.write_slots] = v
        if self.window is not None:
            self.cache.norms[layer, plan.write_slots] = norms.float()
            if plan.elect_slots is not None:
                best = elect(self.cache.norms[layer][plan.elect_slots])
                chosen = plan.elect_slots.gather(1, best[:, None])[:, 0]
                self.cache.node_k[layer][:, plan.node_targets] = pool_k[:, chosen]
                self.cache.node_v[layer][:, plan.node_targets] = pool_v[:, chosen]
        node_k = self.cache.node_k[layer] if self.window is not None else pool_k
        node_v = self.cache.node_v[layer] if self.window is not None else pool_v
        if plan.decode_table is not None and gate is None:  # one softmax over window and nodes
            second = None if self.window is None else (node_k, node_v, plan.decode_split)
            return paged_decode_triton.gqa_decode(q.transpose(0, 1), pool_k, pool_v, *plan.decode_table,
                                                  second=second, page=plan.decode_page, firsts=plan.decode_firsts,
                                                  node_pages=plan.node_pages).transpose(0, 1)
        if plan.prefill_plan is not None:
            return paged_decode_triton.gqa_prefill(
                q.transpose(0, 1), pool_k, pool_v, plan.prefill_plan, window=self.window, interval=self.interval,
                nodes=None if self.window is None else (node_k, node_v), gate=gate).transpose(0, 1)
        if plan.local_table is not None and gate is not None:
            # routed: p_local * Attn(window) + p_global * Attn(nodes); a path the router zeroed,
            # or no node yet (its attention is 0), adds nothing
            rows = q.transpose(0, 1)
            local = paged_decode_triton.gqa_decode(rows, pool_k, pool_v, *plan.local_table, page=plan.decode_page,
                                                   firsts=plan.decode_firsts)
            nodes = paged_decode_triton.gqa_decode(rows, node_k, node_v, *plan.node_table, page=plan.node_pages[1])
            g = gate.to(q.dtype)
            return (g[:, 0, None, None] * local + g[:, 1, None, None] * nodes).transpose(0, 1)
        outs, a = [], 0
        for sp in plan.seqs:
            keys, values = pool_k[:, sp.local_slots], pool_v[:, sp.local_slots]
            num_local = keys.shape[1]
            if sp.node_slots is not None and sp.node_slots.numel():
                keys = torch.cat((keys, self.cache.node_k[layer][:, sp.node_slots]), dim=1)
                values = torch.cat((values, self.cache.node_v[layer][:, sp.node_slots]), dim=1)
            ctx = AttentionContext(keys, values, num_local, sp.local_start, sp.start)
            g = None if gate is None else gate[a : a + sp.num_new]
            outs.append(sparse_attention(q[:, a : a + sp.num_new], ctx, self.window, self.interval, g))
            a += sp.num_new
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


class JoinedLayerCaches:
    """One layer of several sequences, each in its own `LayerCache`, as one batch sees it (the
    serving engine's batched MTP drafts): the rows are the sequences' rows one after another."""

    def __init__(self, caches: list[LayerCache], lengths: list[int], window: int | None,
                 interval: int | None) -> None:
        self.caches, self.lengths, self.window, self.interval = caches, lengths, window, interval

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, norms: torch.Tensor | None,
               gate: torch.Tensor | None) -> torch.Tensor:
        outs, a = [], 0
        for cache, n in zip(self.caches, self.lengths, strict=True):
            b = a + n
            ctx = cache.extend(k[:, a:b], v[:, a:b], None if norms is None else norms[a:b])
            outs.append(sparse_attention(q[:, a:b], ctx, self.window, self.interval,
                                         None if gate is None else gate[a:b]))
            a = b
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
