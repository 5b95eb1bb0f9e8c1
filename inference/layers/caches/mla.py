"""The cache of Multi-head Latent Attention (DeepSeek-V2/V3, GLM-4.7-Flash, GLM-5): per layer and
position one latent row, `kv_lora_rank` values of the normed compressed key/value plus
`qk_rope_head_dim` of the rotated key that all heads share, instead of per-head keys and values
(GLM-4.7-Flash: 576 values a layer where its 20 heads' K/V would be 10,240).

`MLALayout` is what the engine asks (inference/layers/caches/layouts.py). Every cache here answers
one call, `extend(rows)`: append the new positions' latent rows `[T, width]` and return, per
sequence, a `LatentContext`, that sequence's latents of all its positions in position order with
the new ones last; the attention (inference/layers/mla.py) does the rest, the same way for all:
- `MLALayerCache`: one layer of one sequence, contiguous (slot p holds position p); `truncate`
  rolls back (rejected speculative drafts).
- `PagedMLACache`: the serving engine's pools, `[layers, slots, width]`; each step's `MLAStep`
  works out once, from the runner's `SequenceSlots`, which slots the step writes and which each
  sequence reads, and its `layers[i]` is what layer i's attention gets. Dense causal attention
  reads every position, so the block manager's plain tables, prefix sharing and preemption need
  nothing more (no node pages, no window).
- `JoinedMLACaches`: several sequences' own `MLALayerCache`s as one batch (batched MTP drafts).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from inference.config import ModelConfig
from inference.layers.caches.paged_slots import SequenceSlots
from inference.layers.kernels import paged_decode_triton


@dataclass
class LatentContext:
    """One sequence's part of an `extend`: its latents `[S, width]` for positions `[0, S)`, the
    last `num_new` of them the rows just appended (their queries sit at `S - num_new ...`)."""

    latents: torch.Tensor
    num_new: int

    @property
    def q_start(self) -> int:
        return self.latents.shape[0] - self.num_new


class MLALayout:
    """Sizes and builds MLA caches for a config (its decoder layers)."""

    def __init__(self, config: ModelConfig) -> None:
        self.num_layers = config.num_hidden_layers
        self.width = config.kv_lora_rank + config.qk_rope_head_dim

    def layer_cache(self, dtype: torch.dtype, device: torch.device, max_positions: int | None = None) -> MLALayerCache:
        return MLALayerCache(self.width, dtype, device, max_positions)

    def layer_cache_bytes(self, dtype: torch.dtype, positions: int) -> int:
        return positions * self.width * dtype.itemsize

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """One position slot of the pools, all layers: one latent row each."""
        return self.num_layers * self.width * dtype.itemsize

    def bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        return block_size * self.bytes_per_token(dtype)

    def node_pages(self, num_blocks: int) -> int:
        return 0

    def longest_sequence(self, num_blocks: int, block_size: int) -> int:
        return num_blocks * block_size

    def paged_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype,
                    device: torch.device) -> PagedMLACache:
        return PagedMLACache(self, num_blocks, block_size, dtype, device)

    def joined_layer_caches(self, caches: list[MLALayerCache], lengths: list[int]) -> JoinedMLACaches:
        return JoinedMLACaches(caches, lengths)


class MLALayerCache:
    """One layer of one sequence: slot p holds position p's latent row. Grows by doubling, up to
    `max_positions` when given (so that its bytes can be budgeted)."""

    def __init__(self, width: int, dtype: torch.dtype, device: torch.device, max_positions: int | None = None) -> None:
        self.length = 0
        self.max_positions = max_positions
        slots = 256 if max_positions is None else min(256, max_positions)
        self.latents = torch.zeros(slots, width, dtype=dtype, device=device)

    def nbytes(self) -> int:
        return self.latents.numel() * self.latents.element_size()

    def extend(self, rows: torch.Tensor) -> list[LatentContext]:
        """Append positions `[length, length + T)` (`rows [T, width]`)."""
        end = self.length + rows.shape[0]
        self._reserve(end)
        self.latents[self.length : end] = rows
        self.length = end
        return [LatentContext(self.latents[:end], rows.shape[0])]

    def truncate(self, length: int) -> None:
        """Drop positions `[length, self.length)`: the next rows overwrite them."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} positions to {length}")
        self.length = length

    def _reserve(self, slots: int) -> None:
        if slots <= self.latents.shape[0]:
            return
        if self.max_positions is not None and slots > self.max_positions:
            raise ValueError(f"a cache made for {self.max_positions} positions was asked for {slots}")
        grown = max(slots, 2 * self.latents.shape[0])
        if self.max_positions is not None:
            grown = min(grown, self.max_positions)
        new = self.latents.new_zeros(grown, self.latents.shape[1])
        new[: self.length] = self.latents[: self.length]
        self.latents = new


class PagedMLACache:
    """The pools: per layer the latent rows of `num_blocks * block_size` position slots."""

    num_node_pages = 0

    def __init__(self, layout: MLALayout, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.layout, self.device = layout, device
        self.num_blocks, self.block_size = num_blocks, block_size
        self.latents = torch.zeros(layout.num_layers, num_blocks * block_size, layout.width, dtype=dtype,
                                   device=device)

    def nbytes(self) -> int:
        return self.latents.numel() * self.latents.element_size()

    def step(self, rows: list[SequenceSlots]) -> MLAStep:
        return MLAStep(self, rows)


class MLAStep:
    """One step on the pools, standing in for `KVCache` in the model's forward: the slots the
    step writes (its rows, sequence after sequence) and the slots each sequence reads (all its
    positions; made on first use: on CUDA the latent kernel reads each sequence's block table),
    shared by every layer."""

    def __init__(self, cache: PagedMLACache, rows: list[SequenceSlots]) -> None:
        device = cache.device
        self._rows, self._device = rows, device
        self.write_slots = torch.cat([row.slots(row.start, row.start + row.num_new) for row in rows]).to(device)
        self.num_new = [row.num_new for row in rows]
        self.totals = [row.start + row.num_new for row in rows]
        # A step on CUDA: every sequence's block table in one padded table, and for each of the
        # step's rows its sequence's row of it and how far it reads (its position + 1), for the
        # latent kernel (one launch a layer, the pool read in place) where the step runs absorbed
        self.latent_table = None
        if paged_decode_triton.wanted(torch.device(device)):
            tables = torch.nn.utils.rnn.pad_sequence([row.table for row in rows], batch_first=True)
            seq = [b for b, n in enumerate(self.num_new) for _ in range(n)]
            reach = [row.start + i + 1 for row in rows for i in range(row.num_new)]
            self.latent_table = (tables.to(device), torch.tensor(reach, device=device),
                                 torch.tensor(seq, dtype=torch.int32, device=device), cache.block_size)
        self.layers = [PagedMLALayer(cache.latents[i], self) for i in range(cache.layout.num_layers)]

    @functools.cached_property
    def read_slots(self) -> list[torch.Tensor]:
        """Each sequence's slots of all its positions, in position order."""
        return [row.slots(0, row.start + row.num_new).to(self._device) for row in self._rows]

    @classmethod
    def decode_only(cls, cache: PagedMLACache, write_slots: torch.Tensor, tables: torch.Tensor,
                    lengths: torch.Tensor) -> MLAStep:
        """A decode step made from device tensors alone (what a CUDA graph replays,
        inference/engine/cuda_graphs.py): row b writes `write_slots[b]` and attends, absorbed
        through the latent kernel, to its positions `[0, lengths[b])` through its block table
        `tables[b]`."""
        rows = tables.shape[0]
        step = cls.__new__(cls)
        step.write_slots = write_slots
        step.num_new, step.totals = [1] * rows, [1] * rows  # one row each: never expanded
        step.latent_table = (tables, lengths, torch.arange(rows, dtype=torch.int32, device=tables.device),
                             cache.block_size)
        step.layers = [PagedMLALayer(cache.latents[i], step) for i in range(cache.layout.num_layers)]
        return step


class PagedMLALayer:
    """What one attention layer sees of the batch."""

    def __init__(self, pool: torch.Tensor, plan: MLAStep) -> None:
        self.pool, self.plan = pool, plan
        self.latent_table = plan.latent_table

    def write(self, rows: torch.Tensor) -> None:
        """Only write the step's rows into their slots (the latent kernel reads the pool)."""
        self.pool[self.plan.write_slots] = rows

    def extend(self, rows: torch.Tensor) -> list[LatentContext]:
        """Write the step's rows (`[T, width]`, sequence after sequence) into their slots; each
        sequence's context gathered from the pool."""
        self.pool[self.plan.write_slots] = rows
        return [LatentContext(self.pool[slots], n) for slots, n in zip(self.plan.read_slots, self.plan.num_new,
                                                                       strict=True)]


class JoinedMLACaches:
    """One layer of several sequences, each in its own `MLALayerCache`, as one batch: the rows
    are the sequences' rows one after another (`lengths` of them each)."""

    def __init__(self, caches: list[MLALayerCache], lengths: list[int]) -> None:
        self.caches, self.lengths = caches, lengths

    def extend(self, rows: torch.Tensor) -> list[LatentContext]:
        contexts, a = [], 0
        for cache, n in zip(self.caches, self.lengths, strict=True):
            contexts += cache.extend(rows[a : a + n])
            a += n
        return contexts
