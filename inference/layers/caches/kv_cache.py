"""All layers of one sequence (`KVCache`): one cache per layer, as the model's layout makes it.

What the model's forward takes for a single sequence outside the paged pools: the serving engine
keeps one per speculative sequence for its MTP layers (`mtp_only`, `inference.engine.drafting`),
and `model.new_cache()` makes a whole one (the parity tests hold every cached, paged and batched
way against it; `bench.engine` times the model step on it). It asks the model's cache layout
(`inference.layers.caches.layouts`) for each layer's cache, whatever the layout.
"""

from __future__ import annotations

import torch

from inference.config import ModelConfig
from inference.layers.caches.layouts import cache_layout


class KVCache:
    """All layers of one sequence: the decoder layers, then one per MTP module, each the cache
    that the model's layout makes (`LayerCache` for GQA)."""

    def __init__(self, config: ModelConfig, device: torch.device | str, dtype: torch.dtype | None = None,
                 mtp_only: bool = False, max_positions: int | None = None) -> None:
        """`mtp_only`: the MTP layers alone (the decoder layers' entries are None), for a
        sequence whose decoder layers live in the serving engine's paged cache.
        `max_positions`: the longest the sequence can get (see `LayerCache`)."""
        layout, dtype, device = cache_layout(config), dtype or config.dtype, torch.device(device)
        self.num_hidden_layers = config.num_hidden_layers
        count = config.num_hidden_layers + config.num_mtp_heads
        self.layers = [
            None if mtp_only and i < config.num_hidden_layers else layout.layer_cache(dtype, device, max_positions)
            for i in range(count)
        ]

    @property
    def length(self) -> int:
        return self.layers[0].length

    def truncate(self, length: int) -> None:
        """Roll the decoder layers back to `length` positions (MTP layers keep their own
        lengths: speculative decoding rolls each back itself)."""
        for layer in self.layers[: self.num_hidden_layers]:
            layer.truncate(length)

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers if layer is not None)
