"""KVCache.truncate: rolling back must leave the cache as if the dropped positions never came."""

import pytest
import torch

from inference.config import ModelConfig
from inference.layers.caches.gqa_sequence import ROLLBACK_LIMIT, LayerCache
from inference.models import MODELS
from tests.inference.helpers import glm5_config


def _tie_free_norms(n: int) -> torch.Tensor:
    return torch.randperm(n).float() + 1.0


@pytest.mark.parametrize("total", [10, 23, 40, 70])
def test_truncate_then_extend_matches_a_cache_that_never_saw_the_rejected(total):
    w, g, heads, d = 16, 4, 2, 8
    k, v = torch.randn(heads, total + 8, d), torch.randn(heads, total + 8, d)
    norms = _tie_free_norms(total + 8)
    junk_k, junk_v = torch.randn(heads, 8, d), torch.randn(heads, 8, d)
    junk_norms = torch.full((8,), 1e6)  # would win every election
    ref, spec = (
        LayerCache(heads, d, w, g, torch.float32, "cpu"),
        LayerCache(heads, d, w, g, torch.float32, "cpu"),
    )
    ref.extend(k[:, :total], v[:, :total], norms[:total])
    spec.extend(k[:, :total], v[:, :total], norms[:total])
    for rejected in (1, 5, 8):
        spec.extend(junk_k[:, :rejected], junk_v[:, :rejected], junk_norms[:rejected])
        spec.truncate(total)
    assert spec.node_positions == ref.node_positions
    for step in range(total, total + 8):  # decode on: every context must agree
        a = ref.extend(k[:, step : step + 1], v[:, step : step + 1], norms[step : step + 1])
        b = spec.extend(k[:, step : step + 1], v[:, step : step + 1], norms[step : step + 1])
        torch.testing.assert_close(a.keys, b.keys)
        torch.testing.assert_close(a.values, b.values)
    assert spec.node_positions == ref.node_positions


@pytest.mark.parametrize("window", [4, 8])
@pytest.mark.parametrize("chunks", [[1] * ROLLBACK_LIMIT, [3, 1, 4, 2, 4, 1, 1]], ids=["tokens", "chunks"])
def test_a_rollback_longer_than_the_window_restores_it(window, chunks):
    """Small windows: the dropped positions wrap the ring, so a slot was overwritten more than
    once and only its first overwrite saved what the kept positions need."""
    g, heads, d, total = 2, 2, 8, 30
    k, v = torch.randn(heads, total + 8, d), torch.randn(heads, total + 8, d)
    norms = _tie_free_norms(total + 8)
    ref, spec = (LayerCache(heads, d, window, g, torch.float32, "cpu") for _ in range(2))
    for cache in (ref, spec):
        cache.extend(k[:, :total], v[:, :total], norms[:total])
    for n in chunks:  # each no longer than the window: the undo log covers them
        spec.extend(torch.randn(heads, n, d), torch.randn(heads, n, d), torch.full((n,), 1e6))
    assert spec.length - total == sum(chunks) == ROLLBACK_LIMIT > window
    spec.truncate(total)
    assert spec.node_positions == ref.node_positions
    for step in range(total, total + 8):
        a = ref.extend(k[:, step : step + 1], v[:, step : step + 1], norms[step : step + 1])
        b = spec.extend(k[:, step : step + 1], v[:, step : step + 1], norms[step : step + 1])
        torch.testing.assert_close(b.keys, a.keys)
        torch.testing.assert_close(b.values, a.values)
    assert spec.node_positions == ref.node_positions


def test_truncate_refuses_to_roll_back_too_far():
    cache = LayerCache(1, 4, 16, 4, torch.float32, "cpu")
    cache.extend(torch.randn(1, 40, 4), torch.randn(1, 40, 4), _tie_free_norms(40))
    with pytest.raises(ValueError):
        cache.truncate(40 - ROLLBACK_LIMIT - 1)


def test_model_forward_after_rollback_equals_a_fresh_run():
    config = ModelConfig.from_dict(glm5_config())
    model = MODELS["glm5_sparse"](config).eval()
    ids = torch.randint(0, config.vocab_size, (60,))
    with torch.inference_mode():
        fresh = model(ids, torch.arange(60), model.new_cache())
        cache = model.new_cache()
        model(ids[:40], torch.arange(40), cache)
        model(torch.randint(0, config.vocab_size, (6,)), torch.arange(40, 46), cache)
        cache.truncate(40)
        tail = model(ids[40:], torch.arange(40, 60), cache)
    torch.testing.assert_close(tail, fresh[40:], atol=1e-5, rtol=1e-5)


def test_no_rollback_below_an_earlier_one():
    """The positions a rollback dropped overwrote the undo and norm log entries of the ones
    before it: a second rollback further back could not restore them, and is refused."""
    cache = LayerCache(1, 4, 8, 2, torch.float32, "cpu")
    cache.extend(torch.randn(1, 20, 4), torch.randn(1, 20, 4), _tie_free_norms(20))
    for _ in range(12):
        cache.extend(torch.randn(1, 1, 4), torch.randn(1, 1, 4), torch.rand(1))
    cache.truncate(24)
    cache.extend(torch.randn(1, 1, 4), torch.randn(1, 1, 4), torch.rand(1))
    cache.truncate(24)  # back to the same point: fine
    with pytest.raises(ValueError, match="below an earlier rollback"):
        cache.truncate(22)
