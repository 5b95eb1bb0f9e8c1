"""Serving figures in one run: `python -m bench.serving` (a few minutes on 2 cores).

1. Output tokens/s for 64 requests of random prompt (16-128) and output (8-32) lengths, greedy,
   on a random GLM-4 of about 40M parameters (fp32, dense): the engine batched
   (`max_num_seqs=32`), the same engine one request at a time (the first SINGLE_SUBSET requests
   only, to keep the run short: a rate, comparable), and transformers `generate()` batched 32 at
   a time with left padding (counting only the tokens each request asked for).
2. TTFT of requests sharing a 1,000-token system prompt (plus a distinct 16-token question),
   one at a time, prefix caching on (after one warm-up request) vs off.
Targets: batched >= 4x one at a time; prefix caching cuts TTFT by >= 40 %.
"""

from __future__ import annotations

import random
import tempfile
import time

import torch
from transformers import Glm4Config
from transformers import Glm4ForCausalLM as HfGlm4

from inference.config import ModelConfig
from inference.engine import EngineArgs, LLMEngine
from inference.loader import load_model
from inference.sampling_params import SamplingParams

NUM_REQUESTS, CONCURRENCY, SINGLE_SUBSET = 64, 32, 16


def build(path: str):
    config = Glm4Config(vocab_size=16000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                        num_attention_heads=8, num_key_value_heads=2, head_dim=64, pad_token_id=0,
                        eos_token_id=[1])
    torch.manual_seed(0)
    hf = HfGlm4(config).eval()
    hf.save_pretrained(path)
    model = load_model(path, ModelConfig.from_pretrained(path), "cpu")
    return hf, model, sum(p.numel() for p in hf.parameters())


def workload(seed: int = 0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(2, 16000) for _ in range(rng.randint(16, 128))] for _ in range(NUM_REQUESTS)]
    params = [SamplingParams(temperature=0, max_tokens=rng.randint(8, 32), ignore_eos=True) for _ in prompts]
    return prompts, params


def engine(model, **kwargs) -> LLMEngine:
    return LLMEngine(model, args=EngineArgs(kv_cache_bytes=1 << 30, **kwargs), eos_token_ids=[])


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def transformers_batched(hf, prompts, params) -> None:
    with torch.inference_mode():
        for a in range(0, len(prompts), CONCURRENCY):
            group = prompts[a : a + CONCURRENCY]
            width = max(map(len, group))
            ids = torch.tensor([[0] * (width - len(p)) + p for p in group])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
            new = max(p.max_tokens for p in params[a : a + CONCURRENCY])
            hf.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False)


def bench_throughput(hf, model) -> None:
    prompts, params = workload()
    useful = sum(p.max_tokens for p in params)
    batched = engine(model, max_num_seqs=CONCURRENCY)
    batched.generate(prompts[:2], params[:2])  # warm-up
    batched = engine(model, max_num_seqs=CONCURRENCY, enable_prefix_caching=False)
    t_batched = timed(lambda: batched.generate(prompts, params))
    subset = zip(prompts[:SINGLE_SUBSET], params[:SINGLE_SUBSET], strict=True)
    t_single = timed(lambda: [batched.generate([p], [sp]) for p, sp in subset])
    t_single *= useful / sum(p.max_tokens for p in params[:SINGLE_SUBSET])  # same rate, all 64
    t_hf = timed(lambda: transformers_batched(hf, prompts, params))
    print(f"{NUM_REQUESTS} requests, prompts 16-128, outputs 8-32 ({useful} output tokens), greedy")
    for name, seconds in ((f"engine batched ({CONCURRENCY} concurrent)", t_batched),
                          (f"engine one at a time ({SINGLE_SUBSET} of them)", t_single),
                          (f"transformers generate() x{CONCURRENCY}", t_hf)):
        print(f"{name:>34}: {useful / seconds:7.1f} output tok/s  ({seconds:5.1f} s)")
    print(f"batched / one at a time: {t_single / t_batched:.2f}x (target >= 4x); "
          f"batched / transformers: {t_hf / t_batched:.2f}x")


def bench_ttft(model) -> None:
    rng = random.Random(1)
    system = [rng.randrange(2, 16000) for _ in range(1000)]
    questions = [[rng.randrange(2, 16000) for _ in range(16)] for _ in range(9)]
    first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    results = {}
    for caching in (False, True):
        eng = engine(model, enable_prefix_caching=caching)
        eng.generate([system + questions[0]], first)  # warm-up (and, with caching, fills the cache)
        times = [timed(lambda q=q, eng=eng: eng.generate([system + q], first)) for q in questions[1:]]
        results[caching] = sorted(times)[len(times) // 2]
    cut = 1 - results[True] / results[False]
    print(f"\nTTFT, 1,000-token shared system prompt + 16-token question, median of {len(questions) - 1}")
    print(f"prefix caching off: {results[False] * 1e3:7.1f} ms; on: {results[True] * 1e3:7.1f} ms; "
          f"cut {cut:.0%} (target >= 40 %)")


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory() as path:
        hf, model, params = build(path)
    print(f"random GLM-4, {params / 1e6:.0f}M parameters, fp32\n")
    bench_ttft(model)
    print()
    bench_throughput(hf, model)


if __name__ == "__main__":
    main()
