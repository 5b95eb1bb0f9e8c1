"""MTP speculative decoding and W8A16 figures, in one run: `python -m bench.speculative`.

1. The demo model (`models/demo`), greedy answers to handbook questions: decode tokens/s of plain
   decoding against MTP speculative decoding at k = 1..4, with the mean accepted length (tokens
   per main-model forward) and the acceptance per draft position.
2. Decode tokens/s at batch 1, fp32 vs bf16 vs int8 (W8A16), on the demo model and on a random
   ~100M-parameter glm5_sparse model (where weight bandwidth, not per-op overhead, decides).
   Batch 8 is not measured: `LLM` runs one request at a time (batching is the serving engine's).
Targets: MTP >= 1.6x plain with mean accepted length >= 2.5; int8 >= 1.4x fp32 at batch 1.
"""

from __future__ import annotations

import argparse
import time

import torch

from inference.config import ModelConfig
from inference.demo.corpus import load_qa
from inference.layers.linear import quantize_linears_
from inference.llm import LLM
from inference.models import MODELS
from inference.sampling_params import SamplingParams

PROMPT, NEW_TOKENS = 16, 48


def _demo_speculative(model_dir: str, questions: int) -> None:
    llm = LLM.from_pretrained(model_dir, dtype="float32")
    prompts = [
        [{"role": "user", "content": item["question"]}]
        for item in load_qa()[:: max(1, 334 // questions)]
    ]
    prompts = prompts[:questions]
    params = SamplingParams(temperature=0, max_tokens=128)
    llm.generate(prompts[0], params)  # warm up
    print(f"1. demo model, {len(prompts)} handbook questions, greedy, fp32")
    plain_rate = None
    for k in (0, 1, 2, 3, 4):
        tokens, seconds, rounds, emitted = 0, 0.0, 0, 0
        accepted = [0] * k
        proposed = [0] * k
        for messages in prompts:
            generation = llm.stream(messages, params, speculative_k=k)
            start = time.perf_counter()
            for _ in generation:
                pass
            seconds += time.perf_counter() - start
            tokens += generation.result.completion_tokens
            if k:
                stats = generation.speculative_stats
                rounds, emitted = rounds + stats.rounds, emitted + stats.emitted
                accepted = [a + b for a, b in zip(accepted, stats.accepted, strict=True)]
                proposed = [a + b for a, b in zip(proposed, stats.proposed, strict=True)]
        rate = tokens / seconds
        if not k:
            plain_rate = rate
            print(f"   plain      {rate:7.1f} tok/s  ({tokens} tokens)")
            continue
        per_position = " ".join(
            f"{a / p:.2f}" if p else "-" for a, p in zip(accepted, proposed, strict=True)
        )
        print(
            f"   MTP k={k}    {rate:7.1f} tok/s  {rate / plain_rate:4.2f}x  mean accepted length "
            f"{emitted / rounds:4.2f}  acceptance per position {per_position}"
        )


def _decode_rate(llm: LLM, prompt: list[int], repeats: int = 2) -> float:
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    llm.generate(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm up
    best = 0.0
    for _ in range(repeats):
        cache = llm.model.new_cache()
        logits = llm.prefill(prompt, cache)
        start = time.perf_counter()
        position = len(prompt)
        for _ in range(params.max_tokens):
            token = int(logits[0].argmax())
            logits = llm.decode(token, position, cache)
            position += 1
        best = max(best, params.max_tokens / (time.perf_counter() - start))
    return best


def _variants(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    bf16 = MODELS[model.config.model_type](model.config)
    bf16.load_state_dict(model.state_dict())
    int8 = MODELS[model.config.model_type](model.config)
    int8.load_state_dict(model.state_dict())
    return {
        "fp32": model,
        "bf16": bf16.to(torch.bfloat16).eval(),
        "int8": quantize_linears_(int8).eval(),
    }


def _dtype_table(name: str, model: torch.nn.Module) -> None:
    prompt = torch.randint(
        10, model.config.vocab_size, (PROMPT,), generator=torch.Generator().manual_seed(0)
    ).tolist()
    params = sum(p.numel() for p in model.parameters())
    rates = {kind: _decode_rate(LLM(m), prompt) for kind, m in _variants(model).items()}
    line = "  ".join(f"{kind} {rate:6.1f} tok/s" for kind, rate in rates.items())
    print(
        f"   {name} ({params / 1e6:.0f}M params): {line}  int8/fp32 {rates['int8'] / rates['fp32']:.2f}x"
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
    return MODELS["glm5_sparse"](config).eval()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.speculative")
    parser.add_argument("--model", default="models/demo")
    parser.add_argument("--questions", type=int, default=12)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    torch.manual_seed(0)
    _demo_speculative(args.model, args.questions)
    print(f"2. decode at batch 1 ({PROMPT}-token prompt, {NEW_TOKENS} new tokens, best of 2)")
    _dtype_table("demo model", LLM.from_pretrained(args.model, dtype="float32").model)
    _dtype_table("random glm5_sparse", _random_100m())
    print("   batch 8: not measured (LLM serves one request at a time)")


if __name__ == "__main__":
    main()
