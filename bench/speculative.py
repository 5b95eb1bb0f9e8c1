"""MTP speculative decoding and W8A16 figures, in one run: `python -m bench.speculative`.

1. The demo model (`models/demo`), greedy answers to handbook questions one at a time (`LLM`, the
   engine at batch 1): decode tokens/s of plain decoding against MTP speculative decoding at every
   k = 1..8, with the mean accepted length
   (tokens per main-model forward) and the acceptance per draft position; the best k is named.
2. The same through the serving engine, eight questions in one continuous batch: tokens/s of
   plain decoding against batched speculative decoding at k=4 (each sequence drafts with its own
   MTP caches; one verify forward for the whole batch).
3. Decode tokens/s of the engine at batch 1, fp32 vs bf16 vs int8 (W8A16), on the demo model and on a random
   ~100M-parameter glm5_sparse model (where weight bandwidth, not per-op overhead, decides);
   and at batch 8, eight requests in one continuous batch of the serving engine.
The machine is shared, so every comparison runs interleaved in one process and reports medians.
Targets: MTP >= 1.6x plain with mean accepted length >= 2.5; int8 >= 1.4x fp32 at batch 1.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from demo.corpus import load_qa
from inference.config import ModelConfig
from inference.engine import EngineArgs, LLMEngine
from inference.layers.linear import quantize_linears_
from inference.llm import LLM
from inference.models import MODELS, cpu_fast_path
from inference.sampling_params import SamplingParams

PROMPT, NEW_TOKENS = 16, 48


def _generation(llm: LLM, messages, params: SamplingParams, k: int) -> tuple[float, object]:
    """Tokens/s of one request alone on the engine, and the speculative rounds it ran."""
    before = copy.deepcopy(llm.speculative_stats)
    start = time.perf_counter()
    output = llm.generate([messages], params, speculative_k=k)[0]
    rate = output.completion_tokens / (time.perf_counter() - start)
    return rate, llm.speculative_stats.since(before)


def _demo_speculative(model_dir: str, questions: int, repeats: int) -> None:
    """Per question, plain and every k back to back (A/B/A/B), so that load from other
    processes hits all of them alike; the figure is the median of the per-question ratios."""
    llm = LLM.from_pretrained(model_dir, dtype="float32")
    prompts = [
        [{"role": "user", "content": item["question"]}]
        for item in load_qa()[:: max(1, 334 // questions)]
    ][:questions]
    params = SamplingParams(temperature=0, max_tokens=128)
    ks = (0, *range(1, 9))
    for k in ks:
        llm.generate(prompts[:1], params, speculative_k=k)  # warm up (prepacked weights, masks)
    rates = {k: [] for k in ks}
    ratios = {k: [] for k in ks}
    totals = {k: [0, 0, [0] * k, [0] * k] for k in ks}  # rounds, emitted, accepted, proposed
    for _ in range(repeats):
        for messages in prompts:
            row = {}
            for k in ks:
                row[k], stats = _generation(llm, messages, params, k)
                rates[k].append(row[k])
                if k:
                    t = totals[k]
                    t[0], t[1] = t[0] + stats.rounds, t[1] + stats.emitted
                    t[2] = [a + b for a, b in zip(t[2], stats.accepted[:k], strict=True)]
                    t[3] = [a + b for a, b in zip(t[3], stats.proposed[:k], strict=True)]
            for k in ks:
                ratios[k].append(row[k] / row[0])
    print(f"1. demo model, {len(prompts)} handbook questions x {repeats}, greedy, fp32 (medians)")
    print(f"   plain      {statistics.median(rates[0]):7.1f} tok/s")
    for k in ks[1:]:
        rounds, emitted, accepted, proposed = totals[k]
        per_position = " ".join(f"{a / p:.2f}" if p else "-" for a, p in zip(accepted, proposed, strict=True))
        print(
            f"   MTP k={k}    {statistics.median(rates[k]):7.1f} tok/s  {statistics.median(ratios[k]):4.2f}x  "
            f"mean accepted length {emitted / rounds:4.2f}  acceptance per position {per_position}"
        )
    best = max(ks[1:], key=lambda k: statistics.median(ratios[k]))
    print(f"   best: k={best}, {statistics.median(ratios[best]):4.2f}x plain")


def _engine_speculative(model_dir: str, repeats: int, batch: int = 8, k: int = 4) -> None:
    """`batch` handbook questions in one engine batch, plain and k interleaved (A/B/A/B);
    tokens/s over the whole run (prefill included), medians of `repeats` runs per question set."""
    llm = LLM.from_pretrained(model_dir, dtype="float32")
    qa = load_qa()
    params = SamplingParams(temperature=0, max_tokens=128)
    rates: dict[int, list[float]] = {0: [], k: []}
    ratios, stats = [], None
    for r in range(repeats + 1):  # the first round warms up
        prompts = [[{"role": "user", "content": item["question"]}] for item in qa[r :: 37][:batch]]
        row = {}
        for kk in (0, k):
            engine = LLMEngine(llm.model, llm.tokenizer, EngineArgs(kv_cache_bytes=1 << 28),
                               sorted(llm.eos_token_ids))
            start = time.perf_counter()
            outputs = engine.generate(prompts, params, speculative_k=kk)
            row[kk] = sum(o.completion_tokens for o in outputs) / (time.perf_counter() - start)
            if kk and r:
                stats = engine.speculative_stats if stats is None else _merged(stats, engine.speculative_stats)
        if r:
            for kk in row:
                rates[kk].append(row[kk])
            ratios.append(row[k] / row[0])
    per_position = " ".join(f"{a:.2f}" for a in stats.acceptance[:k])
    print(f"2. serving engine, batch {batch} (handbook questions, greedy, fp32; medians of {repeats})")
    print(f"   plain      {statistics.median(rates[0]):7.1f} tok/s")
    print(f"   MTP k={k}    {statistics.median(rates[k]):7.1f} tok/s  {statistics.median(ratios):4.2f}x  "
          f"mean accepted length {stats.mean_accepted_length:4.2f}  acceptance per position {per_position}")


def _merged(a, b):
    """Two engines' `SpeculativeStats` summed."""
    a.proposed = [x + y for x, y in zip(a.proposed, b.proposed, strict=True)]
    a.accepted = [x + y for x, y in zip(a.accepted, b.accepted, strict=True)]
    a.length_counts = [x + y for x, y in zip(a.length_counts, b.length_counts, strict=True)]
    a.rounds, a.emitted = a.rounds + b.rounds, a.emitted + b.emitted
    return a


def _batch_rate(model: torch.nn.Module, prompts: list[list[int]]) -> float:
    """Decode tokens/s of the engine with all prompts in one continuous batch (one: batch 1)."""
    engine = LLMEngine(model, args=EngineArgs(kv_cache_bytes=1 << 28), eos_token_ids=[])
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, params)
    engine.step()  # the prefill of every prompt (and the first tokens)
    start, steps = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return steps * len(prompts) / (time.perf_counter() - start)


def _variants(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    bf16 = MODELS[model.config.model_type](model.config)
    bf16.load_state_dict(model.state_dict())
    int8 = MODELS[model.config.model_type](model.config)
    int8.load_state_dict(model.state_dict())
    return {
        "fp32": model,
        "bf16": cpu_fast_path.install_(bf16.to(torch.bfloat16)).eval(),
        "int8": cpu_fast_path.install_(quantize_linears_(int8)).eval(),
    }


def _dtype_table(name: str, model: torch.nn.Module, repeats: int) -> None:
    """fp32, bf16 and int8 decode interleaved (A/B/C/A/B/C), medians of `repeats` runs."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, model.config.vocab_size, (PROMPT,), generator=gen).tolist() for _ in range(8)]
    params = sum(p.numel() for p in model.parameters())
    variants = _variants(model)
    for variant in variants.values():  # warm up (the kernels' plans and weight copies)
        _batch_rate(variant, prompts[:1])
    for batch in (1, 8):
        rates = {kind: [] for kind in variants}
        for _ in range(repeats):
            for kind in variants:
                with torch.inference_mode():
                    rate = _batch_rate(variants[kind], prompts[:batch])
                rates[kind].append(rate)
        med = {kind: statistics.median(r) for kind, r in rates.items()}
        line = "  ".join(f"{kind} {rate:6.1f}" for kind, rate in med.items())
        print(
            f"   {name} ({params / 1e6:.0f}M params), batch {batch}: {line} tok/s  "
            f"int8/fp32 {med['int8'] / med['fp32']:.2f}x  bf16/fp32 {med['bf16'] / med['fp32']:.2f}x"
        )


def _random_100m() -> torch.nn.Module:
    raw = {
        "model_type": "glm5_sparse",
        "vocab_size": 32000,
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "num_mtp_heads": 0,
    }
    config = ModelConfig.from_dict(raw)
    return cpu_fast_path.install_(MODELS["glm5_sparse"](config)).eval()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.speculative")
    parser.add_argument("--model", default="models/demo")
    parser.add_argument("--questions", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    torch.manual_seed(0)
    _demo_speculative(args.model, args.questions, args.repeats)
    _engine_speculative(args.model, args.repeats)
    print(f"3. decode, fp32 vs bf16 vs int8 ({PROMPT}-token prompts, {NEW_TOKENS} new tokens, medians)")
    # the demo's runs take a tenth of a second each: more of them steady the medians
    _dtype_table("demo model", LLM.from_pretrained(args.model, dtype="float32").model, 3 * args.repeats)
    _dtype_table("random glm5_sparse", _random_100m(), args.repeats)


if __name__ == "__main__":
    main()
