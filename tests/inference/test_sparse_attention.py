"""The sparse attention against a plain, obviously-correct reading of the contract (inference/layers/attention.py)."""

import math

import pytest
import torch
import torch.nn.functional as F

from inference.layers import attention
from inference.layers.attention import sparse_attention
from inference.layers.caches.gqa_sequence import LayerCache

W, G, HQ, HKV, D = 16, 4, 4, 2, 8


def elect_nodes(norms, g):
    """Per complete block, the position of the largest norm; the earliest on ties."""
    nodes = []
    for b in range(len(norms) // g):
        best = b * g
        for p in range(b * g, b * g + g):
            if norms[p] > norms[best]:
                best = p
        nodes.append(best)
    return nodes


def reference(q, k, v, norms, window, interval, gate=None):
    """Masked dense attention over the same keys; routed: the weighted mix of two softmaxes."""
    n = q.shape[1]
    rep = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    t = torch.arange(n)[:, None]
    s = torch.arange(n)[None]
    local = (s <= t) & (s > t - window)
    node_mask = torch.zeros(n, n, dtype=torch.bool)
    for b, p in enumerate(elect_nodes(norms.tolist(), interval)):
        block_end = b * interval + interval - 1
        node_mask[:, p] = block_end < torch.arange(n) - window + 1
    assert not (node_mask & local).any()

    def attn(mask):
        scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return torch.nan_to_num(probs) @ v  # a query with no key gets nothing

    if gate is None:
        return attn(local | node_mask)
    return gate[:, 0, None] * attn(local) + gate[:, 1, None] * attn(node_mask)


def run_engine(q, k, v, norms, chunks, window=W, interval=G, gate=None):
    """Feed the sequence through a LayerCache in the given chunk sizes."""
    cache = LayerCache(k.shape[0], k.shape[2], window, interval, k.dtype, torch.device("cpu"))
    outs, a = [], 0
    for size in chunks:
        b = a + size
        ctx = cache.extend(k[:, a:b], v[:, a:b], norms[a:b])
        outs.append(sparse_attention(q[:, a:b], ctx, window, interval, None if gate is None else gate[a:b]))
        a = b
    assert a == q.shape[1]
    return torch.cat(outs, dim=1), cache


def inputs(n):
    q, k, v = torch.randn(HQ, n, D), torch.randn(HKV, n, D), torch.randn(HKV, n, D)
    return q, k, v, torch.rand(n) + 0.5


def routed_gate(n, threshold=0.2):
    p = torch.softmax(2 * torch.randn(n, 3), dim=-1)[:, :2]
    return torch.where(p >= threshold, p, torch.zeros_like(p))


N = 300  # crosses the 256-query prefill tile, many windows and blocks
# "small": chunks of a few queries, as speculative verify and MTP drafts run them (the lean
# path of `sparse_attention`), crossing window, block and node-visibility boundaries.
SMALL = [3, 5, 2, 9, 4, 7, 1, 6]
CHUNKINGS = {
    "full": [N],
    "chunked": [5, 17, 1, 40, 237],
    "decode": [20] + [1] * (N - 20),
    "small": SMALL * (N // sum(SMALL)) + [N % sum(SMALL)],
}


@pytest.mark.parametrize("chunks", CHUNKINGS.values(), ids=CHUNKINGS.keys())
def test_union_mode_matches_reference(chunks):
    q, k, v, norms = inputs(N)
    out, cache = run_engine(q, k, v, norms, chunks)
    torch.testing.assert_close(out, reference(q, k, v, norms, W, G), atol=1e-5, rtol=1e-5)
    assert cache.node_positions == elect_nodes(norms.tolist(), G)


@pytest.mark.parametrize("chunks", CHUNKINGS.values(), ids=CHUNKINGS.keys())
def test_routed_mode_matches_reference(chunks):
    q, k, v, norms = inputs(N)
    gate = routed_gate(N)
    assert (gate == 0).any(dim=0).all()  # both paths get skipped somewhere
    out, _ = run_engine(q, k, v, norms, chunks, gate=gate)
    torch.testing.assert_close(out, reference(q, k, v, norms, W, G, gate), atol=1e-5, rtol=1e-5)


def test_window_covering_the_sequence_is_dense_causal():
    q, k, v, norms = inputs(40)
    out, _ = run_engine(q, k, v, norms, [25, 1, 14], window=64, interval=4)
    dense = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 0), v.repeat_interleave(2, 0), is_causal=True)
    torch.testing.assert_close(out, dense, atol=1e-6, rtol=1e-5)


def test_ties_elect_the_earliest_and_nodes_never_change():
    q, k, v, _ = inputs(24)
    norms = torch.tensor([1.0, 3, 3, 2] * 6)
    _, cache = run_engine(q, k, v, norms, [3, 1, 1, 7, 12])
    assert cache.node_positions == [1, 5, 9, 13, 17, 21]


def test_path_below_threshold_is_not_computed(monkeypatch):
    """Decode with p_global under the threshold runs one attention (local), not two."""
    q, k, v, norms = inputs(60)
    calls = []
    real = attention._attend
    monkeypatch.setattr(attention, "_attend", lambda *a: calls.append(a[1].shape[1]) or real(*a))
    cache = LayerCache(HKV, D, W, G, torch.float32, torch.device("cpu"))
    cache.extend(k[:, :59], v[:, :59], norms[:59])
    ctx = cache.extend(k[:, 59:], v[:, 59:], norms[59:])
    assert ctx.keys.shape[1] - ctx.num_local == (59 - W + 1) // G  # there are nodes to skip
    calls.clear()
    sparse_attention(q[:, 59:], ctx, W, G, torch.tensor([[0.7, 0.0]]))
    assert calls == [W]
    calls.clear()
    sparse_attention(q[:, 59:], ctx, W, G, torch.tensor([[0.7, 0.3]]))
    assert calls == [W, (59 - W + 1) // G]
