"""The paged KV cache's bookkeeping: which block holds which positions of which sequence.

Two pools of the same kind (`BlockPool`): position blocks of `block_size` positions (keys,
values and, when sparse, the layer-input norms that elect key nodes), and, when the cache layout
has them (`num_node_pages`, the sparse GQA layout's `node_pages`: inference/layers/caches/gqa.py),
node pages of `block_size // global_interval` key nodes: node page i of a sequence holds the nodes
elected in its position block i (`block_size` must be a multiple of `global_interval`, so no
interval straddles two blocks). A node is copied into its page the moment its interval
completes; a position block that slid out of the window is then released, whatever nodes it held,
so a sequence keeps about W + n/G positions, not n (the sparse-attention contract, inference/layers/attention.py).

Prefix caching: a full block is keyed by a chained hash of all tokens up to its end. The position
block and the node page of the same full block share that key (both depend on the prefix
only), so a hit shares the elected nodes too. A released block keeps its key and contents until
the pool hands it out again, so a later request can revive it. A hit of k blocks needs every node
page of the k blocks plus the position blocks that the window of position k*B still reaches.
"""

from __future__ import annotations

import hashlib
from collections import deque

from inference.engine.sequence import Sequence
from inference.layers.sparse_rules import window_start


class BlockPool:
    """Fixed-size blocks with reference counts; free blocks are reused oldest-released first, so
    cached contents survive as long as possible."""

    def __init__(self, num_blocks: int) -> None:
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}
        self.free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free)

    def allocate(self) -> int:
        block = self.free.popleft()
        key = self.block_hash[block]
        if key is not None and self.cached.get(key) == block:
            del self.cached[key]  # its old contents are about to be overwritten
        self.block_hash[block] = None
        self.ref_counts[block] = 1
        return block

    def take(self, block: int) -> None:
        """One more reference to a cached block, reviving it if it was free."""
        if self.ref_counts[block] == 0:
            self.free.remove(block)
        self.ref_counts[block] += 1

    def release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free.append(block)

    def register(self, block: int, key: bytes) -> None:
        self.block_hash[block] = key
        self.cached[key] = block


def chain_hash(previous: bytes | None, tokens: list[int]) -> bytes:
    h = hashlib.blake2b(previous or b"", digest_size=16)
    h.update(b"".join(t.to_bytes(4, "little") for t in tokens))
    return h.digest()


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        window: int | None = None,
        interval: int | None = None,
        num_node_pages: int = 0,
        enable_prefix_caching: bool = True,
    ) -> None:
        if window is not None and block_size % interval:
            raise ValueError(f"block_size {block_size} must be a multiple of global_interval {interval}")
        self.block_size, self.window, self.interval = block_size, window, interval
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = BlockPool(num_blocks)
        self.nodes = BlockPool(num_node_pages) if num_node_pages else None

    @property
    def num_free_blocks(self) -> int:
        free = self.blocks.num_free
        return free if self.nodes is None else min(free, self.nodes.num_free)

    def all_free(self) -> bool:
        full = len(self.blocks.ref_counts)
        return self.blocks.num_free == full and (self.nodes is None or self.nodes.num_free == len(self.nodes.ref_counts))

    # -- admission: the prefix cache ---------------------------------------------------------
    def allocate_prefix(self, seq: Sequence) -> None:
        """Give a sequence with nothing computed the longest cached prefix (at least one token
        is left to compute: its logits are needed)."""
        self._update_hashes(seq, seq.num_tokens)
        k = self._prefix_hit(seq) if self.enable_prefix_caching else 0
        for i in range(k):
            block = self.blocks.cached.get(seq.block_hashes[i], -1)
            if block >= 0 and self._in_window(i, k * self.block_size):
                self.blocks.take(block)
            else:
                block = -1
            seq.block_table.append(block)
            if self.nodes is not None:
                page = self.nodes.cached[seq.block_hashes[i]]
                self.nodes.take(page)
                seq.node_table.append(page)
        seq.num_computed_tokens = seq.num_cached_tokens = k * self.block_size
        seq.num_keyed_blocks = k
        seq.num_slid_out = self._first_in_window(k * self.block_size)

    def _prefix_hit(self, seq: Sequence) -> int:
        end = seq.num_tokens - 1 if seq.compute_from is None else min(seq.num_tokens - 1, seq.compute_from)
        limit = min(len(seq.block_hashes), end // self.block_size)
        hits = [key in self.blocks.cached for key in seq.block_hashes[:limit]]
        if self.nodes is None:
            return hits.index(False) if False in hits else limit
        nodes = [key in self.nodes.cached for key in seq.block_hashes[:limit]]
        k = nodes.index(False) if False in nodes else limit
        while k and not all(hits[self._first_in_window(k * self.block_size) : k]):
            k -= 1
        return k

    def _first_in_window(self, position: int) -> int:
        """The first block the window of a query at `position` still reaches."""
        if self.window is None:
            return 0
        return window_start(position, self.window) // self.block_size

    def _in_window(self, block: int, position: int) -> bool:
        return block >= self._first_in_window(position)

    # -- growth ---------------------------------------------------------------------------------
    def _blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        end = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-end // self.block_size) - len(seq.block_table))

    def max_new_tokens(self, seq: Sequence) -> int:
        """How many more positions the sequence could take with the blocks free now."""
        held = len(seq.block_table) + self.num_free_blocks
        return max(0, held * self.block_size - seq.num_computed_tokens)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self._blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        for _ in range(self._blocks_needed(seq, num_new_tokens)):
            seq.block_table.append(self.blocks.allocate())
            if self.nodes is not None:
                seq.node_table.append(self.nodes.allocate())

    # -- after a step -----------------------------------------------------------------------------
    def advance(self, seq: Sequence) -> None:
        """After positions up to `seq.num_computed_tokens` are in the cache: key the blocks that
        just became full, release the ones that slid out of the window and those past the end
        (a speculative step allocates for every draft; the rejected ones leave blocks that hold
        no kept position). Only full blocks of kept positions are keyed: a prefix-cache hash
        never covers a rejected draft."""
        full = seq.num_computed_tokens // self.block_size
        if self.enable_prefix_caching:
            self._update_hashes(seq, full * self.block_size)
            for i in range(seq.num_keyed_blocks, full):
                self.blocks.register(seq.block_table[i], seq.block_hashes[i])
                if self.nodes is not None:
                    self.nodes.register(seq.node_table[i], seq.block_hashes[i])
            seq.num_keyed_blocks = max(seq.num_keyed_blocks, full)
        first = self._first_in_window(seq.num_computed_tokens)
        for i in range(seq.num_slid_out, first):
            if seq.block_table[i] >= 0:
                self.blocks.release(seq.block_table[i])
                seq.block_table[i] = -1
        seq.num_slid_out = max(seq.num_slid_out, first)
        held = -(-seq.num_computed_tokens // self.block_size)
        while len(seq.block_table) > held:
            block = seq.block_table.pop()
            if block >= 0:
                self.blocks.release(block)
            if self.nodes is not None:
                self.nodes.release(seq.node_table.pop())

    def _update_hashes(self, seq: Sequence, num_tokens: int) -> None:
        b = self.block_size
        for i in range(len(seq.block_hashes), num_tokens // b):
            previous = seq.block_hashes[-1] if seq.block_hashes else None
            seq.block_hashes.append(chain_hash(previous, seq.token_ids[i * b : (i + 1) * b]))

    def free(self, seq: Sequence) -> None:
        """Release everything the sequence holds (finished, failed or preempted)."""
        for block in seq.block_table:
            if block >= 0:
                self.blocks.release(block)
        for page in seq.node_table:
            self.nodes.release(page)
        seq.block_table, seq.node_table, seq.num_slid_out, seq.num_keyed_blocks = [], [], 0, 0
        seq.num_computed_tokens = 0
