"""The compiled one-row decode (`wecom_layer_decode`: a layer with its cache append and attention;
`wecom_decode_step`: the whole model) gives the torch layers' numbers and leaves every cache as
`LayerCache.extend` does, in every attention mode, with shapes the vector loops do not divide,
across window and block boundaries and speculative rollbacks; and steps aside where it does not
apply."""

import ctypes

import pytest
import torch
import torch.nn.functional as F

from inference.layers.caches.gqa_sequence import ROLLBACK_LIMIT
from inference.layers.caches.kv_cache import KVCache
from inference.layers.kernels import cpu_kernels
from inference.models import cpu_decode, cpu_step
from tests.inference.test_kv_cache import build

pytestmark = pytest.mark.usefixtures("cpu_kernels_built")

# hidden 40 and intermediate 72 (not multiples of 16 or 64), head_dim 12 with 3 rotary pairs,
# 3 query heads per kv head; a window of 8 and blocks of 3 (odd, crossed many times in 40 tokens)
ODD = {"hidden_size": 40, "intermediate_size": 72, "num_attention_heads": 6, "num_key_value_heads": 2,
       "head_dim": 12, "sliding_window": 8, "global_interval": 3}
MODES = {
    "glm5-routed": {},
    "glm5-routed-no-threshold": {"route_threshold": 0.0},
    "glm5-union": {"routed": False},
    "glm5-union-odd": {"routed": False, **ODD},
    "glm5-routed-odd-one-kv-head": {**ODD, "num_key_value_heads": 1},
    "glm4-sparse-bias-odd": {"model_type": "glm4", "num_mtp_heads": 0, "attention_bias": True, **ODD},
    "glm4-dense": {"model_type": "glm4", "sliding_window": None, "global_interval": None, "num_mtp_heads": 0},
    "glm4-dense-odd": {"model_type": "glm4", "num_mtp_heads": 0, **ODD, "sliding_window": None,
                       "global_interval": None},
}
N = 40


def model_for(overrides):
    torch.manual_seed(0)
    return build(**overrides)


def run(model, ids, chunks, compiled: bool, monkeypatch, cache=None, start=0):
    """Hidden states of `ids` fed in `chunks` from position `start`, through the compiled paths or
    the torch layers only."""
    cache = model.new_cache() if cache is None else cache
    outs, a = [], 0
    with monkeypatch.context() as patch, torch.inference_mode():
        if not compiled:
            patch.setattr(cpu_decode, "layer_plan", lambda layer: None)
        for size in chunks:
            positions = torch.arange(start + a, start + a + size)
            outs.append(model(ids[a : a + size], positions, cache))
            a += size
    return torch.cat(outs), cache


def assert_same_cache(a: KVCache, b: KVCache, live_only: bool = False) -> None:
    """Everything a `LayerCache` keeps: keys, values, nodes, the block being filled, the logs
    that rollback reads. `live_only`: only what the positions held now can still read (slots
    and log entries that rolled-back positions overwrote may differ)."""
    for x, y in zip(a.layers, b.layers, strict=True):
        assert (x.length, x.node_positions, x._filled) == (y.length, y.node_positions, y._filled)
        if x.window is None or not live_only:
            torch.testing.assert_close(x.k, y.k, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(x.v, y.v, atol=1e-5, rtol=1e-5)
        if x.window is None:
            continue
        torch.testing.assert_close(x.block_norms[: x._filled], y.block_norms[: y._filled])
        if not live_only:
            for name in ("norm_log", "undo_k", "undo_v"):
                torch.testing.assert_close(getattr(x, name), getattr(y, name), atol=1e-5, rtol=1e-5)
            continue
        w, n = x.window, x.length
        live = [*range(min(n, w)), *range(w, w + x.num_nodes)]  # the ring and the elected nodes
        torch.testing.assert_close(x.k[:, live], y.k[:, live], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(x.v[:, live], y.v[:, live], atol=1e-5, rtol=1e-5)
        # a later rollback goes back to `lowest` at most: it reads the norms of the block
        # `lowest` falls in, and the undo entries of the positions it drops
        size, lowest = x.norm_log.numel(), max(n - ROLLBACK_LIMIT, x._floor, y._floor, 0)
        logged = [p % size for p in range(max(0, n - size, lowest - lowest % x.interval), n)]
        torch.testing.assert_close(x.norm_log[logged], y.norm_log[logged])
        undone = [p % ROLLBACK_LIMIT for p in range(max(w, lowest), n)]
        torch.testing.assert_close(x.undo_k[:, undone], y.undo_k[:, undone], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(x.undo_v[:, undone], y.undo_v[:, undone], atol=1e-5, rtol=1e-5)


@pytest.fixture
def steps(monkeypatch):
    """How many tokens went through `cpu_step.step` whole."""
    taken = []
    real = cpu_step.step

    def counting(*args):
        out = real(*args)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(cpu_step, "step", counting)
    return taken


@pytest.mark.parametrize("overrides", MODES.values(), ids=MODES.keys())
def test_decoding_token_by_token_equals_the_torch_layers_and_their_caches(monkeypatch, steps, overrides):
    model = model_for(overrides)
    ids = torch.randint(0, 128, (N,), generator=torch.Generator().manual_seed(1))
    chunks = [2] + [1] * (N - 2)
    torch_out, torch_cache = run(model, ids, chunks, False, monkeypatch)
    assert not any(steps)
    out, cache = run(model, ids, chunks, True, monkeypatch)
    assert sum(steps) == N - 2  # every token after the 2-token prompt
    torch.testing.assert_close(out, torch_out, atol=1e-5, rtol=1e-5)
    assert_same_cache(cache, torch_cache)


@pytest.fixture
def row_calls(monkeypatch):
    """The row counts of the layer calls that took `wecom_layer_decode_rows`."""
    taken = []
    real = cpu_decode._decode_rows

    def counting(lib, plan_, h, *rest):
        out = real(lib, plan_, h, *rest)
        if out is not None:
            taken.append(h.shape[0])
        return out

    monkeypatch.setattr(cpu_decode, "_decode_rows", counting)
    return taken


# 40 positions; 7 and 9 rows are past what the odd models' window of 8 takes at once (8 - 3 + 1)
ROW_CHUNKS = [3, 2, 5, 1, 4, 6, 2, 7, 1, 9]


@pytest.mark.parametrize("overrides", MODES.values(), ids=MODES.keys())
def test_rows_of_one_sequence_equal_the_torch_layers_and_their_caches(monkeypatch, row_calls, overrides):
    """Several rows at once (a speculative verify, an MTP depth catching up) in one call a layer,
    each row appended and attending in turn: the torch layers' numbers and every cache entry,
    across window and block ends (blocks completed inside a chunk elected from the norm log).
    Chunks longer than `window - interval + 1` take the two calls around the torch attention."""
    model = model_for(overrides)
    ids = torch.randint(0, 128, (N,), generator=torch.Generator().manual_seed(8))
    torch_out, torch_cache = run(model, ids, ROW_CHUNKS, False, monkeypatch)
    out, cache = run(model, ids, ROW_CHUNKS, True, monkeypatch)
    w, g = model.config.sliding_window, model.config.global_interval
    taken = [n for n in ROW_CHUNKS if n > 1 and (w is None or n + g - 1 <= w)]
    assert row_calls == [n for n in taken for _ in model.model.layers]
    assert len(taken) >= 5
    torch.testing.assert_close(out, torch_out, atol=1e-5, rtol=1e-5)
    assert_same_cache(cache, torch_cache)


@pytest.mark.parametrize("appended", ["tokens", "chunk"])
@pytest.mark.parametrize("overrides", [MODES["glm5-routed"], MODES["glm4-sparse-bias-odd"]],
                         ids=["glm5-routed", "glm4-sparse-bias-odd"])
def test_rollbacks_undo_what_the_compiled_rows_wrote(monkeypatch, overrides, appended):
    """Speculative decoding: tokens appended (compiled, one by one or as one verify chunk) and
    rolled back leave the cache as if they had never come, past the window (the undo log),
    across block ends (elections undone), and longer than the odd model's window of 8 (a ring
    slot overwritten twice)."""
    model = model_for(overrides)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 128, (N,), generator=gen)
    _, fresh = run(model, ids, [12] + [1] * (N - 12), False, monkeypatch)
    _, cache = run(model, ids[:12], [12], True, monkeypatch)
    length = 12
    # up to the most a rollback undoes; a chunk no longer than the window (none rolls back into one)
    most = ROLLBACK_LIMIT if appended == "tokens" else min(ROLLBACK_LIMIT, model.config.sliding_window)
    for rejected in (3, 5, 7, most):
        junk = torch.randint(0, 128, (rejected,), generator=gen)
        run(model, junk, [1] * rejected if appended == "tokens" else [rejected], True, monkeypatch, cache,
            start=length)
        cache.truncate(length)
        run(model, ids[length : length + 5], [1] * 5, True, monkeypatch, cache, start=length)
        length += 5
    run(model, ids[length:], [1] * (N - length), True, monkeypatch, cache, start=length)
    assert_same_cache(cache, fresh, live_only=True)


def test_speculative_verify_chunks_and_single_tokens_mix(monkeypatch, steps):
    """A few rows at once (one call a layer, or two around the torch attention for 16 rows and
    more than the window takes) between single tokens (the whole-model call) keep one cache
    consistent."""
    model = model_for({})
    ids = torch.randint(0, 128, (N,), generator=torch.Generator().manual_seed(3))
    chunks = [5, 1, 1, 4, 1, 9, 1, 1, 2, 1, 13, 1]
    torch_out, torch_cache = run(model, ids, chunks, False, monkeypatch)
    out, cache = run(model, ids, chunks, True, monkeypatch)
    assert sum(steps) == chunks.count(1)
    torch.testing.assert_close(out, torch_out, atol=1e-5, rtol=1e-5)
    assert_same_cache(cache, torch_cache)


def test_a_layer_called_alone_takes_the_one_row_call(monkeypatch):
    """The MTP block (and any layer called by itself with one row and a `LayerCache`) runs
    `wecom_layer_decode`, through windows and blocks."""
    model = model_for(ODD)
    calls = []
    real = cpu_decode._decode_row
    monkeypatch.setattr(cpu_decode, "_decode_row", lambda *a: calls.append(1) or real(*a))
    hidden = torch.randn(N, 40, generator=torch.Generator().manual_seed(4))
    ids = torch.randint(0, 128, (N,), generator=torch.Generator().manual_seed(5))
    results = []
    for compiled in (False, True):
        cache = model.new_cache()
        with monkeypatch.context() as patch, torch.inference_mode():
            if not compiled:
                patch.setattr(cpu_decode, "layer_plan", lambda layer: None)
            results.append(torch.cat([
                model.mtp_forward(0, hidden[i : i + 1], ids[i : i + 1], torch.tensor([i]), cache) for i in range(N)
            ]))
    assert len(calls) == N
    torch.testing.assert_close(results[1], results[0], atol=1e-5, rtol=1e-5)


def test_the_step_is_the_same_bits_on_one_thread_and_two():
    model = model_for({})
    ids = torch.randint(0, 128, (N,), generator=torch.Generator().manual_seed(6))
    outs = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            cache, rows = model.new_cache(), []
            with torch.inference_mode():
                for i in range(N):
                    rows.append(model(ids[i : i + 1], torch.tensor([i]), cache))
            outs.append(torch.cat(rows))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1])


def test_a_checkpoint_loaded_model_takes_it_too(tmp_path, monkeypatch, steps):
    """Input-major weights as the loader stores them: the kernels read their output-major copies."""
    from tests.inference.test_cpu_decode import load

    model = load(tmp_path, model_type="glm4", num_mtp_heads=0, attention_bias=True)
    ids = torch.randint(0, 128, (N,), generator=torch.Generator().manual_seed(7))
    chunks = [3] + [1] * (N - 3)
    torch_out, _ = run(model, ids, chunks, False, monkeypatch)
    steps.clear()
    out, _ = run(model, ids, chunks, True, monkeypatch)
    assert steps == [False] + [True] * (N - 3)  # the 3-token prompt, then every token
    torch.testing.assert_close(out, torch_out, atol=1e-5, rtol=1e-5)


def test_changes_to_the_model_outside_the_layers_are_followed(monkeypatch, steps):
    model = model_for({"model_type": "glm4", "num_mtp_heads": 0})
    ids = torch.randint(0, 128, (12,), generator=torch.Generator().manual_seed(8))
    chunks = [1] * 12
    run(model, ids, chunks, True, monkeypatch)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.5)  # in place
        model.model.norm.weight.add_(0.25)
    model.model.layers[1].post_mlp_layernorm.weight = torch.nn.Parameter(torch.rand(32) + 0.5)
    steps.clear()
    out, _ = run(model, ids, chunks, True, monkeypatch)
    assert all(steps)
    torch_out, _ = run(model, ids, chunks, False, monkeypatch)
    torch.testing.assert_close(out, torch_out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
def test_new_rotary_frequencies_are_followed(monkeypatch, compiled):
    """A replaced `rotary.inv_freq` (a scaled rope): both paths rotate by it from then on, as a
    model that had it from the start does."""
    model, twin = model_for({}), model_for({})
    ids = torch.randint(0, 128, (N,), generator=torch.Generator().manual_seed(12))
    chunks = [3] + [1] * (N - 3)
    run(model, ids, chunks, compiled, monkeypatch)
    for m in (model, twin):
        m.rotary.inv_freq = m.rotary.inv_freq * 0.25
    out, _ = run(model, ids, chunks, compiled, monkeypatch)
    torch.testing.assert_close(out, run(twin, ids, chunks, False, monkeypatch)[0], atol=1e-5, rtol=1e-5)


def test_a_new_route_threshold_is_followed(monkeypatch, steps):
    model = model_for({})
    ids = torch.randint(0, 128, (N,), generator=torch.Generator().manual_seed(11))
    chunks = [1] * N
    run(model, ids, chunks, True, monkeypatch)
    for layer in model.model.layers:
        layer.route_threshold = 0.4  # more paths skipped than at 0.2
    steps.clear()
    out, _ = run(model, ids, chunks, True, monkeypatch)
    assert all(steps)
    torch.testing.assert_close(out, run(model, ids, chunks, False, monkeypatch)[0], atol=1e-5, rtol=1e-5)


def test_it_steps_aside_where_it_does_not_apply(monkeypatch, steps):
    model = model_for({})
    one, at = torch.tensor([5]), torch.tensor([0])
    with torch.inference_mode():
        assert cpu_step.step(model, one, at, model.new_cache()) is not None
        assert cpu_step.step(model, torch.tensor([5, 6]), torch.arange(2), model.new_cache()) is None
        assert cpu_step.step(model, one.int(), at, model.new_cache()) is None
        assert cpu_step.step(model, one, at.int(), model.new_cache()) is None
        assert cpu_step.step(model, one, at, KVCache(model.config, "cpu", torch.bfloat16)) is None
        assert cpu_step.step(model, one, at, KVCache(model.config, "cpu", mtp_only=True)) is None
    assert cpu_step.step(model, one, at, model.new_cache()) is None  # autograd on
    seen = []
    handle = model.model.layers[1].register_forward_hook(lambda *args: seen.append(1))
    with torch.inference_mode():
        model(one, at, model.new_cache())
    handle.remove()
    assert seen == [1]  # the hook ran: the layers ran one by one
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: seen.append(2))
    with torch.inference_mode():
        assert cpu_step.step(model, one, at, model.new_cache()) is None
    handle.remove()


def test_a_token_outside_the_vocabulary_gets_torchs_error_and_appends_nothing():
    model = model_for({})
    cache = model.new_cache()
    with torch.inference_mode():
        model(torch.tensor([3]), torch.tensor([0]), cache)
        with pytest.raises(IndexError):
            model(torch.tensor([128]), torch.tensor([1]), cache)
        assert cpu_step.step(model, torch.tensor([-1]), torch.tensor([1]), cache) is None
    assert [layer.length for layer in cache.layers[:2]] == [1, 1]


def test_the_portable_build_gives_the_same_numbers(tmp_path, monkeypatch):
    """The loops a CPU without AVX-512 compiles (libm's expf, 8 partial sums), forced here."""
    portable = cpu_kernels.declare(ctypes.CDLL(str(cpu_kernels.build(cpu_kernels._compiler(), tmp_path,
                                                                      ("-DWECOM_GEMV_PORTABLE",)))))
    model = model_for(ODD)
    ids = torch.randint(0, 128, (N,), generator=torch.Generator().manual_seed(9))
    chunks = [2] + [1] * (N - 2)
    torch_out, torch_cache = run(model, ids, chunks, False, monkeypatch)
    monkeypatch.setattr(cpu_kernels, "library", lambda: portable)
    out, cache = run(model, ids, chunks, True, monkeypatch)
    torch.testing.assert_close(out, torch_out, atol=1e-5, rtol=1e-5)
    assert_same_cache(cache, torch_cache)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 2304 + 5])
def test_silu_mul_matches_torch_over_the_whole_range(n):
    """The vector exp behind SiLU and the softmax: ~1 ulp in range, 0 and inf past it, NaN kept."""
    gen = torch.Generator().manual_seed(n)
    g = torch.cat((torch.randn(n, generator=gen) * 30, torch.tensor([0.0, -0.0, 88.0, -88.0, 104.0, -104.0,
                                                                     200.0, -200.0, 1e-30, -1e-30])))
    u = torch.randn(g.numel(), generator=gen)
    out = torch.empty_like(g)
    cpu_kernels.library().wecom_silu_mul(g.data_ptr(), u.data_ptr(), out.data_ptr(), g.numel())
    torch.testing.assert_close(out, F.silu(g) * u, atol=1e-6, rtol=3e-7)
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.5] * 4)
    out, ones = torch.empty_like(special), torch.ones(16)
    cpu_kernels.library().wecom_silu_mul(special.data_ptr(), ones.data_ptr(), out.data_ptr(), 16)
    torch.testing.assert_close(out, F.silu(special), equal_nan=True)


def test_attention_over_scores_far_apart_matches_sdpa(monkeypatch):
    """Queries and keys scaled up: softmax over scores hundreds apart (the exp's range edges)."""
    model = model_for(MODES["glm4-dense"])
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.qkv_proj.weight.mul_(6)
    ids = torch.randint(0, 128, (24,), generator=torch.Generator().manual_seed(10))
    torch_out, _ = run(model, ids, [1] * 24, False, monkeypatch)
    out, _ = run(model, ids, [1] * 24, True, monkeypatch)
    torch.testing.assert_close(out, torch_out, atol=1e-4, rtol=1e-4)
