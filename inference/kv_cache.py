"""The single-sequence KV cache: per layer, the last W positions plus the key nodes.

Memory grows as W + n/G, not n (see `LayerCache`). The model never owns cache state: each
attention layer gets its `LayerCache` and asks it for the keys its queries attend to, so a paged,
batched cache can later stand in with the same `extend()` contract.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.config import ModelConfig


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


class LayerCache:
    """Keys and values of one layer for one sequence.

    Sparse (window W, interval G): slots `[0, W)` are a ring of the last W positions (position p
    in slot p % W) and slot `W + j` holds the key node of block j, elected the moment block j is
    complete (all its positions are still in the ring then, since G <= W) and kept for the whole
    sequence. The positions of the block being filled wait in a small pending buffer with their
    hidden-state norms until the block completes. Positions that slid out of the ring and are no
    node are simply overwritten: that is the freeing.

    Dense (`window` None): slot p holds position p.
    """

    def __init__(
        self,
        num_kv_heads: int,
        head_dim: int,
        window: int | None,
        interval: int | None,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.window, self.interval = window, interval
        self.length = 0
        self.node_positions: list[int] = []
        slots = 256 if window is None else window + 64
        self.k = torch.zeros(num_kv_heads, slots, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self._pending_k = self.k[:, :0]
        self._pending_v = self.v[:, :0]
        self._pending_norms = torch.zeros(0, device=device)

    @property
    def num_nodes(self) -> int:
        return len(self.node_positions)

    @property
    def num_positions(self) -> int:
        """Positions whose keys are held: the window (or all, dense) plus the key nodes."""
        if self.window is None:
            return self.length
        return min(self.length, self.window) + self.num_nodes

    def nbytes(self) -> int:
        """Bytes allocated for keys and values (ring, node slots and the pending block)."""
        tensors = (self.k, self.v, self._pending_k, self._pending_v)
        return sum(t.numel() * t.element_size() for t in tensors)

    def extend(self, k: torch.Tensor, v: torch.Tensor, norms: torch.Tensor | None) -> AttentionContext:
        """Append positions `[length, length + L)` and return the context their queries need.

        `k`, `v`: `[kv_heads, L, head_dim]` (rotary applied); `norms`: `[L]` L2 norms of the
        layer-input hidden states, used to elect key nodes (sparse only).
        """
        start, n = self.length, k.shape[1]
        if self.window is None:
            ctx = self._extend_dense(k, v, start)
        else:
            self._elect(k, v, norms, start)
            ctx = self._extend_sparse(k, v, start)
        self.length += n
        return ctx

    def _reserve(self, slots: int) -> None:
        if slots <= self.k.shape[1]:
            return
        grown = max(slots, 2 * self.k.shape[1] - (self.window or 0))
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_zeros(old.shape[0], grown, old.shape[2])
            new[:, : old.shape[1]] = old
            setattr(self, name, new)

    def _extend_dense(self, k: torch.Tensor, v: torch.Tensor, start: int) -> AttentionContext:
        end = start + k.shape[1]
        self._reserve(end)
        self.k[:, start:end] = k
        self.v[:, start:end] = v
        return AttentionContext(self.k[:, :end], self.v[:, :end], end, 0, start)

    def _elect(self, k: torch.Tensor, v: torch.Tensor, norms: torch.Tensor, start: int) -> None:
        """Elect the node of every block completed by these positions: the largest norm, earliest on ties."""
        g = self.interval
        pend_k = torch.cat((self._pending_k, k), dim=1)
        pend_v = torch.cat((self._pending_v, v), dim=1)
        pend_norms = torch.cat((self._pending_norms, norms.float()))
        first = start - self._pending_norms.numel()  # position of pend_*[:, 0]
        blocks = pend_norms.numel() // g
        if blocks:
            # argmax returns the first maximal index: ties go to the earliest position.
            offsets = pend_norms[: blocks * g].view(blocks, g).argmax(dim=1)
            picked = offsets + torch.arange(blocks, device=offsets.device) * g
            base = self.window + self.num_nodes
            self._reserve(base + blocks)
            self.k[:, base : base + blocks] = pend_k[:, picked]
            self.v[:, base : base + blocks] = pend_v[:, picked]
            self.node_positions.extend((picked + first).tolist())
        done = blocks * g
        # clone: the pending block must not keep the whole chunk alive through a view.
        self._pending_k = pend_k[:, done:].clone()
        self._pending_v = pend_v[:, done:].clone()
        self._pending_norms = pend_norms[done:].clone()

    def _valid_nodes(self, position: int) -> int:
        """How many nodes a query at `position` sees: blocks ending before its window starts."""
        return max(0, position - self.window + 1) // self.interval

    def _extend_sparse(self, k: torch.Tensor, v: torch.Tensor, start: int) -> AttentionContext:
        w, n = self.window, k.shape[1]
        if n == 1:
            # Decode: the new key overwrites the position that just left the window, so the
            # filled ring is exactly this query's window, and the valid nodes follow it.
            slot = start % w
            self.k[:, slot] = k[:, 0]
            self.v[:, slot] = v[:, 0]
            local = min(start + 1, w)
            end = w + self._valid_nodes(start) if local == w else local
            return AttentionContext(self.k[:, :end], self.v[:, :end], local, None, start)
        # Prefill: lay the previous window out in position order, followed by the chunk.
        prev = torch.arange(max(0, start - w + 1), start, device=k.device)
        nodes = slice(w, w + self.num_nodes)
        keys = torch.cat((self.k[:, prev % w], k, self.k[:, nodes]), dim=1)
        values = torch.cat((self.v[:, prev % w], v, self.v[:, nodes]), dim=1)
        tail = torch.arange(max(start, start + n - w), start + n, device=k.device)
        self.k[:, tail % w] = k[:, tail - start]
        self.v[:, tail % w] = v[:, tail - start]
        return AttentionContext(keys, values, prev.numel() + n, start - prev.numel(), start)


class KVCache:
    """All layers of one sequence: the decoder layers, then one per MTP module."""

    def __init__(self, config: ModelConfig, device: torch.device | str, dtype: torch.dtype | None = None) -> None:
        count = config.num_hidden_layers + config.num_mtp_heads
        self.layers = [
            LayerCache(
                config.num_key_value_heads,
                config.head_dim,
                config.sliding_window,
                config.global_interval,
                dtype or config.dtype,
                torch.device(device),
            )
            for _ in range(count)
        ]

    @property
    def length(self) -> int:
        return self.layers[0].length

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)
