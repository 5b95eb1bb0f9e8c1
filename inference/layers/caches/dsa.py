"""The cache of DeepSeek Sparse Attention (GLM-5): MLA's latent rows (inference/layers/caches/mla.py)
plus, in the layers that run their own indexer ("full" in `indexer_types`), the indexer's key of
every position (`index_head_dim` values; inference/layers/dsa_indexer.py). "Shared" layers keep
latents only. Every cache here answers `extend(rows, keys=None)` with one `IndexedContext` a
sequence: its latents and, where the layer has them, its indexer keys, both in position order.

The serving engine's pools allocate the key pool for the full layers alone; a contiguous
single-sequence cache allocates its keys on the first `extend` that brings some (it does not know
its layer). Dense causal positions as MLA's: the block manager's tables, prefix sharing and
preemption need nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.config import ModelConfig
from inference.layers.caches.mla import (
    LatentContext,
    MLALayerCache,
    MLALayout,
    MLAStep,
    PagedMLACache,
)
from inference.layers.caches.paged_slots import SequenceSlots


@dataclass
class IndexedContext(LatentContext):
    """`LatentContext` plus the indexer keys `[S, index_head_dim]` of the same positions (None in
    a shared layer). With `slots` (the paged cache) `latents` and `index_keys` are the layer's
    whole pools and position p's rows are `latents[slots[p]]` and `index_keys[slots[p]]`: the
    indexer and the attention read them there, and a decode step never gathers a sequence's
    every row (at 32k positions that gather cost more than the sparse attention itself)."""

    index_keys: torch.Tensor | None = None
    slots: torch.Tensor | None = None

    @property
    def q_start(self) -> int:
        length = self.latents.shape[0] if self.slots is None else self.slots.shape[0]
        return length - self.num_new

    def rows_of(self, picked: torch.Tensor) -> torch.Tensor:
        """The rows of `latents` holding the chosen positions `picked` (any shape)."""
        return picked if self.slots is None else self.slots[picked]


class DSALayout(MLALayout):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.key_width = config.index_head_dim
        self.full_layers = [i for i, kind in enumerate(config.indexer_types) if kind == "full"]

    def layer_cache(self, dtype: torch.dtype, device: torch.device, max_positions: int | None = None) -> DSALayerCache:
        return DSALayerCache(self.width, self.key_width, dtype, device, max_positions)

    def layer_cache_bytes(self, dtype: torch.dtype, positions: int) -> int:
        """A full layer's (a shared one keeps no keys)."""
        return positions * (self.width + self.key_width) * dtype.itemsize

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return (self.num_layers * self.width + len(self.full_layers) * self.key_width) * dtype.itemsize

    def paged_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype,
                    device: torch.device) -> PagedDSACache:
        return PagedDSACache(self, num_blocks, block_size, dtype, device)

    def joined_layer_caches(self, caches: list[DSALayerCache], lengths: list[int]) -> JoinedDSACaches:
        return JoinedDSACaches(caches, lengths)


class DSALayerCache(MLALayerCache):
    """One layer of one sequence: latents, and indexer keys once a full layer brings them."""

    def __init__(self, width: int, key_width: int, dtype: torch.dtype, device: torch.device,
                 max_positions: int | None = None) -> None:
        super().__init__(width, dtype, device, max_positions)
        self.key_width = key_width
        self.index_keys: torch.Tensor | None = None

    def nbytes(self) -> int:
        keys = 0 if self.index_keys is None else self.index_keys.numel() * self.index_keys.element_size()
        return super().nbytes() + keys

    def extend(self, rows: torch.Tensor, keys: torch.Tensor | None = None) -> list[IndexedContext]:
        start = self.length
        (ctx,) = super().extend(rows)
        if keys is None:
            return [IndexedContext(ctx.latents, ctx.num_new)]
        if self.index_keys is None:
            if start:
                raise ValueError("indexer keys must come with every position of a layer, from the first")
            self.index_keys = rows.new_zeros(self.latents.shape[0], self.key_width)
        self.index_keys[start : self.length] = keys
        return [IndexedContext(ctx.latents, ctx.num_new, self.index_keys[: self.length])]

    def _reserve(self, slots: int) -> None:
        super()._reserve(slots)
        if self.index_keys is not None and self.index_keys.shape[0] < self.latents.shape[0]:
            grown = self.index_keys.new_zeros(self.latents.shape[0], self.key_width)
            grown[: self.length] = self.index_keys[: self.length]
            self.index_keys = grown


class PagedDSACache(PagedMLACache):
    """MLA's latent pools plus `[full layers, slots, index_head_dim]` indexer key pools."""

    def __init__(self, layout: DSALayout, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__(layout, num_blocks, block_size, dtype, device)
        self.index_keys = torch.zeros(len(layout.full_layers), num_blocks * block_size, layout.key_width,
                                      dtype=dtype, device=device)
        self.key_pool = {layer: i for i, layer in enumerate(layout.full_layers)}

    def nbytes(self) -> int:
        return super().nbytes() + self.index_keys.numel() * self.index_keys.element_size()

    def step(self, rows: list[SequenceSlots]) -> MLAStep:
        step = MLAStep(self, rows)
        step.layers = [PagedDSALayer(layer.pool, self.index_keys[self.key_pool[i]] if i in self.key_pool else None,
                                     step) for i, layer in enumerate(step.layers)]
        return step


class PagedDSALayer:
    """What one attention layer sees of the batch: its latent pool and, in a full layer, its key pool."""

    def __init__(self, pool: torch.Tensor, key_pool: torch.Tensor | None, plan: MLAStep) -> None:
        self.pool, self.key_pool, self.plan = pool, key_pool, plan
        # a decode-only step on CUDA (its rows' chosen slots go to the latent kernel in one launch)
        self.batched_decode = plan.latent_table is not None and all(n == 1 for n in plan.num_new)

    def extend(self, rows: torch.Tensor, keys: torch.Tensor | None = None) -> list[IndexedContext]:
        plan = self.plan
        self.pool[plan.write_slots] = rows
        if keys is not None:
            self.key_pool[plan.write_slots] = keys
        return [IndexedContext(self.pool, n, None if keys is None else self.key_pool, slots)
                for slots, n in zip(plan.read_slots, plan.num_new, strict=True)]


class JoinedDSACaches:
    """Several sequences' own `DSALayerCache`s of one layer as one batch (rows one after another)."""

    def __init__(self, caches: list[DSALayerCache], lengths: list[int]) -> None:
        self.caches, self.lengths = caches, lengths

    def extend(self, rows: torch.Tensor, keys: torch.Tensor | None = None) -> list[IndexedContext]:
        contexts, a = [], 0
        for cache, n in zip(self.caches, self.lengths, strict=True):
            contexts += cache.extend(rows[a : a + n], None if keys is None else keys[a : a + n])
            a += n
        return contexts
