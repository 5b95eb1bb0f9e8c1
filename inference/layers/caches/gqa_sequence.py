"""GQA's cache for one sequence (`LayerCache`): per layer, the last W positions plus the key nodes.

Memory grows as W + n/G, not n. The model never owns cache state: each attention layer gets its
layer's cache and asks it for the keys its queries attend to (`extend`, an `AttentionContext`).
The serving engine keeps one per MTP layer of a speculative sequence (the MTP layers roll back
every round); `KVCache` (kv_cache.py) holds one per layer for a whole model's forward on one
sequence. The compiled one-row decode (`inference/models/cpu_decode.py`) writes into it where
`row_slots`/`rows_slots` say.
"""

from __future__ import annotations

import torch

from inference.layers.attention import AttentionContext
from inference.layers.sparse_rules import elect, nodes_seen, window_start

# How far `truncate` can roll a sparse cache back (speculative decoding rejects at most k + 1 <= 9
# positions): the ring slots and block norms the newest positions overwrote are kept this long.
ROLLBACK_LIMIT = 16


class LayerCache:
    """Keys and values of one layer for one sequence.

    Sparse (window W, interval G): slots `[0, W)` are a ring of the last W positions (position p
    in slot p % W) and slot `W + j` holds the key node of block j, elected the moment block j is
    complete (all its positions are still in the ring then, since G <= W) and kept for the whole
    sequence. Until then only the hidden-state norms of the block being filled are kept; its keys
    are in the ring. Positions that slid out of the ring and are no
    node are simply overwritten: that is the freeing.

    Dense (`window` None): slot p holds position p.

    `truncate` rolls the newest positions back (rejected speculative tokens): an undo log keeps
    what the last `ROLLBACK_LIMIT` positions overwrote in the ring, and a log of recent norms
    rebuilds the block being filled; nodes of blocks that are no longer complete are un-elected.
    """

    def __init__(
        self,
        num_kv_heads: int,
        head_dim: int,
        window: int | None,
        interval: int | None,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int | None = None,
    ) -> None:
        """`max_positions`: the longest sequence this cache will hold, if known; its slots then
        never grow past what that needs (`cache_slots`), so that its bytes can be budgeted."""
        self.window, self.interval = window, interval
        self.length = 0
        self.node_positions: list[int] = []
        self.max_slots = None if max_positions is None else cache_slots(window, interval, max_positions)
        slots = 256 if window is None else window + 64
        if self.max_slots is not None:
            slots = min(slots, self.max_slots)
        self.k = torch.zeros(num_kv_heads, slots, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        # norms of the block being filled: the first `_filled` entries
        self.block_norms = torch.zeros(interval or 0, device=device)
        self._filled = 0
        if window is not None:
            # position p: the ring slot it overwrote in undo slot p % ROLLBACK_LIMIT, its norm in
            # norm-log slot p % (interval + ROLLBACK_LIMIT)
            self.undo_k = torch.zeros(num_kv_heads, ROLLBACK_LIMIT, head_dim, dtype=dtype, device=device)
            self.undo_v = torch.zeros_like(self.undo_k)
            self.norm_log = torch.zeros(interval + ROLLBACK_LIMIT, device=device)
            self._floor = 0  # no rollback below it (see `truncate`)

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
        """Bytes allocated for keys and values (ring and node slots)."""
        return self.k.numel() * self.k.element_size() * 2

    @staticmethod
    def bytes_when_full(num_kv_heads: int, head_dim: int, window: int | None, interval: int | None,
                        dtype: torch.dtype, positions: int) -> int:
        """Everything a cache made with `max_positions=positions` allocates once it holds them
        all: keys and values, and for a sparse layer the rollback log and the norms it keeps."""
        width, size = num_kv_heads * head_dim, dtype.itemsize
        kv = 2 * cache_slots(window, interval, positions) * width * size
        if window is None:
            return kv
        return kv + 2 * ROLLBACK_LIMIT * width * size + (2 * interval + ROLLBACK_LIMIT) * 4

    def extend(self, k: torch.Tensor, v: torch.Tensor, norms: torch.Tensor | None) -> AttentionContext:
        """Append positions `[length, length + L)` and return the context their queries need.

        `k`, `v`: `[kv_heads, L, head_dim]` (rotary applied); `norms`: `[L]` L2 norms of the
        layer-input hidden states, used to elect key nodes (sparse only).
        """
        start, n = self.length, k.shape[1]
        if self.window is None:
            ctx = self._extend_dense(k, v, start)
        else:
            self._log(norms, start)
            self._elect(k, v, norms, start)
            ctx = self._extend_sparse(k, v, start)
        self.length += n
        return ctx

    def row_slots(self) -> tuple[int, int, int, int, int, int]:
        """Where a kernel that appends one position itself (the compiled one-row decode of
        `inference/models/cpu_decode.py`) writes it, room made first: (the slot of its key and
        value, the undo slot that slot's old contents go to or -1, the norm-log index or -1, the
        block-norm index or -1, window keys, node keys). Its query attends to slots `[0, window)`
        and `[window, window + nodes)`: what `extend` hands a single query. `row_appended` ends
        the append; between the two the cache must not be touched."""
        start, w = self.length, self.window
        if w is None:
            self._reserve(start + 1)
            return start, -1, -1, -1, start + 1, 0
        local = min(start + 1, w)
        nodes = nodes_seen(start, w, self.interval) if local == w else 0
        undo = start % ROLLBACK_LIMIT if start >= w else -1
        return start % w, undo, start % self.norm_log.numel(), self._filled, local, nodes

    def rows_slots(self, n: int) -> list[tuple[int, int, int, int, int]] | None:
        """`row_slots` for `n` consecutive positions that a kernel appends in one call, each
        written and then attending before the next (the compiled rows of
        `inference/models/cpu_decode.py`: a speculative verify, an MTP depth catching up): per
        row (its slot, undo slot or -1, norm-log index or -1, window keys, node keys). The kernel
        notes no block norms; `rows_appended` elects from the norm log afterwards. None (sparse)
        for more rows than the undo log keeps, or where `n + interval - 1 > window`: a block
        completed among them could then lose its first positions from the ring before that
        election, or a node elected among them be due to a later one of them."""
        start, w = self.length, self.window
        if w is None:
            self._reserve(start + n)
            return [(p, -1, -1, p + 1, 0) for p in range(start, start + n)]
        if n > ROLLBACK_LIMIT or n + self.interval - 1 > w:
            return None
        size, g, rows = self.norm_log.numel(), self.interval, []
        for p in range(start, start + n):
            local = min(p + 1, w)
            rows.append((p % w, p % ROLLBACK_LIMIT if p >= w else -1, p % size, local,
                         nodes_seen(p, w, g) if local == w else 0))
        return rows

    def rows_appended(self, n: int) -> None:
        """After a kernel wrote positions `[length, length + n)` where `rows_slots` said: elect
        the nodes of the blocks they completed (their norms from the log, their keys all still
        in the ring), and count them."""
        if self.window is not None:
            self._elect(None, None, self._norm_slice(self.length, self.length + n), self.length)
        self.length += n

    def row_appended(self) -> None:
        """After a kernel wrote position `length` where `row_slots` said: elect the node of the
        block it completed, and count it. The election comes after the ring write here (it
        precedes it in `extend`): the elected key is the new one or still in the ring either
        way, since a block is never longer than the window."""
        if self.window is not None:
            if self._filled + 1 < self.interval:
                self._filled += 1
            else:
                self._elect_filled_block()
        self.length += 1

    def _elect_filled_block(self) -> None:
        """`_elect` for the block that position `length` completes, its norms all in
        `block_norms` and its keys in the ring."""
        w = self.window
        position = self.length - self.interval + 1 + int(elect(self.block_norms))
        base = w + self.num_nodes
        self._reserve(base + 1)
        self.k[:, base] = self.k[:, position % w]
        self.v[:, base] = self.v[:, position % w]
        self.node_positions.append(position)
        self._filled = 0

    def truncate(self, length: int) -> None:
        """Drop positions `[length, self.length)`, as if they had never been appended.

        Sparse: at most `ROLLBACK_LIMIT` positions, never into a chunk longer than the window
        and never below an earlier rollback's length (the positions dropped then overwrote the
        undo and norm log entries of the positions before it; speculative decoding only ever
        rolls back to what it has verified, which does not shrink)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} positions to {length}")
        if self.window is None or length == self.length:
            self.length = length
            return
        if self.length - length > ROLLBACK_LIMIT or length < self._floor:
            raise ValueError(f"a sparse cache rolls back at most {ROLLBACK_LIMIT} positions, never into a chunk "
                             "longer than the window nor below an earlier rollback")
        w, g = self.window, self.interval
        if self.length > w:  # before that the dropped positions overwrote nothing
            # Only the first w dropped positions: a rollback longer than the window overwrote
            # some slots twice, and the later overwrites saved dropped keys in the undo log.
            dropped = torch.arange(max(length, w), min(self.length, length + w), device=self.k.device)
            self.k[:, dropped % w] = self.undo_k[:, dropped % ROLLBACK_LIMIT]
            self.v[:, dropped % w] = self.undo_v[:, dropped % ROLLBACK_LIMIT]
        complete = length // g
        del self.node_positions[complete:]
        self._filled = length - complete * g
        if self._filled:
            self.block_norms[: self._filled] = self._norm_slice(complete * g, length)
        self.length = length
        self._floor = max(self._floor, length)

    def _norm_slice(self, a: int, b: int) -> torch.Tensor:
        """The logged norms of positions `[a, b)` (a plain slice unless the log wraps there:
        speculative rollback runs this for every layer, every round)."""
        size = self.norm_log.numel()
        if a % size + (b - a) <= size:
            return self.norm_log[a % size : a % size + (b - a)]
        return self.norm_log[torch.arange(a, b, device=self.norm_log.device) % size]

    def _log(self, norms: torch.Tensor, start: int) -> None:
        """Note what the newest positions overwrite, so that `truncate` can restore it."""
        w, n = self.window, norms.numel()
        if n == 1:  # decode: plain indexing, a handful of tiny copies per layer
            self.norm_log[start % self.norm_log.numel()] = norms[0]
            if start >= w:
                self.undo_k[:, start % ROLLBACK_LIMIT] = self.k[:, start % w]
                self.undo_v[:, start % ROLLBACK_LIMIT] = self.v[:, start % w]
            return
        if n > w:  # only the chunk's last w positions reach the ring: no rolling back into it
            self._floor = start + n
        size = self.norm_log.numel()
        first = max(start, start + n - size)
        if first % size + (start + n - first) <= size:  # no wrap: one slice
            self.norm_log[first % size : first % size + start + n - first] = norms[first - start :]
        else:
            recent = torch.arange(first, start + n, device=norms.device)
            self.norm_log[recent % size] = norms[recent - start].float()
        if start + n > w:
            recent = torch.arange(max(start, w, start + n - ROLLBACK_LIMIT), start + n, device=norms.device)
            self.undo_k[:, recent % ROLLBACK_LIMIT] = self.k[:, recent % w]
            self.undo_v[:, recent % ROLLBACK_LIMIT] = self.v[:, recent % w]

    def _reserve(self, slots: int) -> None:
        if slots <= self.k.shape[1]:
            return
        grown = max(slots, 2 * self.k.shape[1] - (self.window or 0))
        if self.max_slots is not None:
            if slots > self.max_slots:
                raise ValueError(f"a cache made for {self.max_slots} slots was asked for {slots}")
            grown = min(grown, self.max_slots)
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

    def _elect(self, k: torch.Tensor | None, v: torch.Tensor | None, norms: torch.Tensor, start: int) -> None:
        """Elect the node of every block completed by these positions: the largest norm, earliest
        on ties. Runs before the ring is overwritten, so earlier positions of the block being
        completed (fewer than G <= W) are still in the ring; `k`, `v` None: the positions are
        in the ring already, and so is every position of the blocks they complete."""
        g, w, filled = self.interval, self.window, self._filled
        if filled + norms.numel() < g:  # no block completes (most decode steps): just note the norms
            self.block_norms[filled : filled + norms.numel()] = norms
            self._filled += norms.numel()
            return
        norms = torch.cat((self.block_norms[:filled], norms.float()))
        first = start - filled  # position of norms[0]
        blocks = norms.numel() // g
        if blocks:
            offsets = elect(norms[: blocks * g].view(blocks, g))
            positions = offsets + torch.arange(blocks, device=offsets.device) * g + first
            in_chunk = (positions >= start)[None, :, None]
            rows = (positions - start).clamp(min=0)
            base = w + self.num_nodes
            self._reserve(base + blocks)
            if k is None:
                self.k[:, base : base + blocks] = self.k[:, positions % w]
                self.v[:, base : base + blocks] = self.v[:, positions % w]
            else:
                self.k[:, base : base + blocks] = torch.where(in_chunk, k[:, rows], self.k[:, positions % w])
                self.v[:, base : base + blocks] = torch.where(in_chunk, v[:, rows], self.v[:, positions % w])
            self.node_positions.extend(positions.tolist())
        self._filled = norms.numel() - blocks * g
        self.block_norms[: self._filled] = norms[blocks * g :]

    def _extend_sparse(self, k: torch.Tensor, v: torch.Tensor, start: int) -> AttentionContext:
        w, n = self.window, k.shape[1]
        if n == 1:
            # Decode: the new key overwrites the position that just left the window, so the
            # filled ring is exactly this query's window, and the valid nodes follow it.
            slot = start % w
            self.k[:, slot] = k[:, 0]
            self.v[:, slot] = v[:, 0]
            local = min(start + 1, w)
            end = w + nodes_seen(start, w, self.interval) if local == w else local
            return AttentionContext(self.k[:, :end], self.v[:, :end], local, None, start)
        if start + n <= w:
            # The ring has not wrapped: slot p holds position p, so the ring itself is the
            # context in position order (no node is valid yet). No copy of the window: that copy
            # made a 5-token speculative verify cost 1.6x a decode step on the demo model.
            self.k[:, start : start + n] = k
            self.v[:, start : start + n] = v
            return AttentionContext(self.k[:, : start + n], self.v[:, : start + n], start + n, 0, start)
        # Prefill: lay the previous window out in position order, followed by the chunk.
        prev = torch.arange(window_start(start, w), start, device=k.device)
        nodes = slice(w, w + self.num_nodes)
        keys = torch.cat((self.k[:, prev % w], k, self.k[:, nodes]), dim=1)
        values = torch.cat((self.v[:, prev % w], v, self.v[:, nodes]), dim=1)
        tail = torch.arange(max(start, start + n - w), start + n, device=k.device)
        self.k[:, tail % w] = k[:, tail - start]
        self.v[:, tail % w] = v[:, tail - start]
        return AttentionContext(keys, values, prev.numel() + n, start - prev.numel(), start)


def cache_slots(window: int | None, interval: int | None, positions: int) -> int:
    """Key/value slots a `LayerCache` needs for a sequence of `positions`: the ring and one node
    per complete block (sparse), or every position (dense)."""
    if window is None:
        return positions
    return window + positions // interval
