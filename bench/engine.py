"""Engine figures on this machine, in one run: `python -m bench.engine` (about 2-3 minutes).

1. Prefill attention of one layer (8 query heads, 2 KV heads, head_dim 64, fp32) at 4k, 16k and
   32k tokens: the engine's sparse path (node election + cache + chunked SDPA, union mode,
   W=512, G=64) against dense causal SDPA; and the KV bytes each has to keep.
2. Decode tokens/s at batch 1 on the same random ~130M-parameter GLM-4 weights (fp32), runs
   interleaved and medians reported: the engine (model step + greedy argmax) against
   transformers `generate()`, over the whole run (prefill included) and over the decode steps
   alone, and the memory-bandwidth bound (weight bytes read per token / read bandwidth measured
   here by summing a 1 GiB tensor), which the decode steps are set against. The bandwidth is
   measured right before and right after every run, and each run's rate is set against the bound
   of the mean of those two readings: on a shared VM the read bandwidth moves between about 45
   and 80 GB/s, at times within a second, so a bound taken once at the start says little about
   the decode runs minutes later, and one taken only before a run is off whenever it moved during
   that run (both ways: 0.70 and 1.27 of such a bound were seen on the same code, 4 Dec 2026).
Targets: sparse prefill at 16k >= 2.5x dense; KV at 32k <= 1/20 of dense; decode >= 1.2x
transformers and >= 80 % of the bound.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import torch
import torch.nn.functional as F
from transformers import Glm4Config
from transformers import Glm4ForCausalLM as HfGlm4

from inference.config import ModelConfig
from inference.layers import linear
from inference.layers.attention import sparse_attention
from inference.layers.caches.gqa_sequence import LayerCache
from inference.loader import load_model

HEADS, KV_HEADS, HEAD_DIM, WINDOW, INTERVAL = 8, 2, 64, 512, 64
PROMPT, NEW_TOKENS = 32, 64
ROUNDS = 7  # decode rounds; their medians are reported


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def read_bandwidth(x: torch.Tensor | None = None, repeats: int = 5) -> float:
    """Bytes per second reading a tensor far larger than the caches (`x`, or a new 1 GiB one)."""
    if x is None:
        x = torch.ones(2**28)  # 1 GiB of fp32
        x.sum()
    return x.numel() * x.element_size() / best_of(x.sum, repeats)


def sparse_prefill(q, k, v, norms) -> LayerCache:
    cache = LayerCache(KV_HEADS, HEAD_DIM, WINDOW, INTERVAL, q.dtype, torch.device("cpu"))
    ctx = cache.extend(k, v, norms)
    sparse_attention(q, ctx, WINDOW, INTERVAL)
    return cache


def dense_prefill(q, k, v) -> None:
    rep = HEADS // KV_HEADS
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)  # 4-D: the flash kernel


def bench_prefill() -> None:
    print(f"prefill attention, one layer: {HEADS} q heads / {KV_HEADS} kv heads x {HEAD_DIM}, fp32, W={WINDOW}, G={INTERVAL}")
    print(f"{'tokens':>7} {'sparse s':>9} {'dense s':>9} {'speedup':>8} {'sparse KV':>11} {'dense KV':>11} {'KV ratio':>9}")
    for n in (4096, 16384, 32768):
        q = torch.randn(HEADS, n, HEAD_DIM)
        k, v = torch.randn(KV_HEADS, n, HEAD_DIM), torch.randn(KV_HEADS, n, HEAD_DIM)
        norms = torch.rand(n)
        with torch.inference_mode():
            sparse_prefill(q, k, v, norms)
            t_sparse = best_of(lambda q=q, k=k, v=v, norms=norms: sparse_prefill(q, k, v, norms), 2)
            t_dense = best_of(lambda q=q, k=k, v=v: dense_prefill(q, k, v), 2)
            cache = sparse_prefill(q, k, v, norms)
        kv_sparse = cache.nbytes()
        kv_dense = 2 * n * KV_HEADS * HEAD_DIM * 4
        print(
            f"{n:>7} {t_sparse:>9.3f} {t_dense:>9.3f} {t_dense / t_sparse:>7.2f}x "
            f"{kv_sparse / 2**20:>9.2f}Mi {kv_dense / 2**20:>9.2f}Mi {kv_sparse / kv_dense:>9.4f}"
        )


def decode_engine(model, prompt: torch.Tensor) -> tuple[float, float]:
    """Seconds for prefill + NEW_TOKENS greedy steps through the engine's model and cache, and
    seconds of those steps alone (one token each)."""
    start = time.perf_counter()
    with torch.inference_mode():
        cache = model.new_cache()
        logits = model.compute_logits(model(prompt, torch.arange(len(prompt)), cache)[-1:])
        steps = time.perf_counter()
        for position in range(len(prompt), len(prompt) + NEW_TOKENS):
            token = logits.argmax(-1)
            logits = model.compute_logits(model(token, torch.tensor([position]), cache))
    end = time.perf_counter()
    return end - start, (end - steps) / NEW_TOKENS


def decode_transformers(model, prompt: torch.Tensor, new_tokens: int = NEW_TOKENS) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            prompt[None], max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
        )
    assert out.shape[1] == len(prompt) + new_tokens
    return time.perf_counter() - start


def bench_decode() -> None:
    hf_config = Glm4Config(
        vocab_size=32000, hidden_size=768, intermediate_size=2304, num_hidden_layers=12,
        num_attention_heads=12, num_key_value_heads=4, head_dim=64, pad_token_id=0, eos_token_id=[1],
    )
    torch.manual_seed(0)
    hf = HfGlm4(hf_config).eval()
    params = sum(p.numel() for p in hf.parameters())
    weight_bytes = (params - hf_config.vocab_size * hf_config.hidden_size) * 4  # embedding: one row per token
    # two engine models of 409 MiB each, both with their kernels' weight copies (output-major for
    # one row, packed for the prefill's rows): past the default 1 GiB cap the second would lose them
    linear.FP32_PACKED_MAX_BYTES = max(linear.FP32_PACKED_MAX_BYTES, 4 * weight_bytes)
    with tempfile.TemporaryDirectory() as path:
        hf.save_pretrained(path)
        engine = load_model(path, ModelConfig.from_pretrained(path), "cpu")
        sparse = load_model(path, ModelConfig.from_pretrained(path, sliding_window=WINDOW, global_interval=INTERVAL), "cpu")
    prompt = torch.randint(2, hf_config.vocab_size, (PROMPT,))
    for model in (engine, sparse):  # first calls make the kernels' plans and weight copies
        decode_engine(model, prompt)
    decode_transformers(hf, prompt)
    # Interleaved (engine, sparse, transformers) x ROUNDS, a bandwidth reading between any two
    # runs, and medians: the machine is shared, so a burst of load should hit all of them alike.
    # Whole runs (prefill included) and decode steps alone: the engine times its steps; for
    # transformers a step is the difference between generating NEW_TOKENS and 1 token, over
    # NEW_TOKENS - 1 steps.
    whole = {"engine": [], "sparse": [], "hf": []}
    step = {"engine": [], "sparse": [], "hf": []}
    around = {"engine": [], "sparse": [], "hf": []}  # each run's bandwidth: the mean of the readings before and after
    big = torch.ones(2**28)
    bandwidths = [read_bandwidth(big, 3)]
    for _ in range(ROUNDS):
        for name, model in (("engine", engine), ("sparse", sparse)):
            total, per_step = decode_engine(model, prompt)
            whole[name].append(total)
            step[name].append(per_step)
            bandwidths.append(read_bandwidth(big, 3))
            around[name].append((bandwidths[-2] + bandwidths[-1]) / 2)
        whole["hf"].append(decode_transformers(hf, prompt))
        step["hf"].append((whole["hf"][-1] - decode_transformers(hf, prompt, 1)) / (NEW_TOKENS - 1))
        bandwidths.append(read_bandwidth(big, 3))
        around["hf"].append((bandwidths[-2] + bandwidths[-1]) / 2)
    del big
    bandwidth = statistics.median(bandwidths)
    print(f"\ndecode, batch 1: random GLM-4, {params / 1e6:.0f}M parameters fp32, {PROMPT}-token prompt + {NEW_TOKENS} new tokens")
    print(
        f"weights read per token {weight_bytes / 2**20:.0f} MiB; read bandwidth between the runs "
        f"{min(bandwidths) / 1e9:.1f}-{max(bandwidths) / 1e9:.1f} GB/s (median "
        f"{bandwidth / 1e9:.1f}): bandwidth bound {bandwidth / weight_bytes:.1f} tok/s"
    )
    print(f"{'':>24}  {'whole run (prefill incl.)':>26}  {'decode steps alone':>38}")
    for name, label in (("engine", "engine dense"), ("sparse", "engine sparse union"), ("hf", "transformers generate()")):
        rate = NEW_TOKENS / statistics.median(whole[name])
        speedup = statistics.median(h / e for h, e in zip(whole["hf"], whole[name], strict=True))
        step_rate = 1 / statistics.median(step[name])
        step_speedup = statistics.median(h / e for h, e in zip(step["hf"], step[name], strict=True))
        # each run's step rate against the bound of the bandwidth around it, then the median
        share = statistics.median(
            (1 / s) / (b / weight_bytes) for s, b in zip(step[name], around[name], strict=True))
        print(f"{label:>24}: {rate:6.1f} tok/s {speedup:5.2f}x transformers   "
              f"{step_rate:6.1f} tok/s {share:6.1%} of bound {step_speedup:5.2f}x transformers")
    print(f"(the x-transformers figures are medians of the {ROUNDS} paired runs' ratios)")


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"read bandwidth {read_bandwidth() / 1e9:.1f} GB/s (sum of a 1 GiB fp32 tensor; measured again around each decode run)\n")
    bench_prefill()
    bench_decode()


if __name__ == "__main__":
    main()
