"""MoE decode figures on this machine, in one run: `python -m bench.moe` (about 5-10 minutes).

A scaled-down GLM-4.5-Air: the same kind of model (GQA, partial rotary on halves, q/k/v
biases, a dense first layer, then MoE layers of 64 routed experts, top-8, one shared expert, the
sigmoid router with its correction bias and no groups, as GLM-4.5-Air has n_group 1), random
weights saved by transformers, ~220M parameters. Decode tokens/s:
- batch 1: the engine's model and cache, greedy (the step of `bench.engine`), against
  transformers `generate()` on the same weights; prefill excluded on both sides (transformers'
  steps are the difference between generating NEW_TOKENS and 1 token);
- batch 16: the serving engine (`LLMEngine`, paged cache, continuous batching) with 16 requests
  against transformers `generate()` on a batch of the 16 prompts (same length, no padding);
- the same engine runs with int8 (W8A16) weights against fp32.
Runs are interleaved over ROUNDS and medians reported (a shared VM's bandwidth moves).
Target (issue #21): at least 2x transformers at batch 1 and 16.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import torch
from transformers import Glm4MoeConfig
from transformers import Glm4MoeForCausalLM as HfGlm4Moe

from inference.config import ModelConfig
from inference.engine import EngineArgs, LLMEngine
from inference.layers import linear
from inference.loader import load_model
from inference.sampling_params import SamplingParams

PROMPT, NEW_TOKENS, BATCH = 32, 32, 16
ROUNDS = int(os.environ.get("BENCH_ROUNDS", 3))

AIR_SHAPED = dict(  # GLM-4.5-Air: hidden 4096, 46 layers, 96/8 heads x 128, 128 experts of 1408, top-8
    vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
    num_key_value_heads=2, head_dim=64, moe_intermediate_size=256, n_routed_experts=64, num_experts_per_tok=8,
    n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=True,
    routed_scaling_factor=1.0, attention_bias=True, use_qk_norm=False, pad_token_id=0, eos_token_id=[1],
)


def engine_batch1(model, prompt: list[int]) -> float:
    """Seconds a greedy decode step takes through the engine's model and cache (prefill excluded)."""
    with torch.inference_mode():
        cache = model.new_cache()
        ids = torch.tensor(prompt)
        logits = model.compute_logits(model(ids, torch.arange(len(prompt)), cache)[-1:])
        start = time.perf_counter()
        for position in range(len(prompt), len(prompt) + NEW_TOKENS):
            logits = model.compute_logits(model(logits.argmax(-1), torch.tensor([position]), cache))
    return (time.perf_counter() - start) / NEW_TOKENS


def engine_batched(model, prompts: list[list[int]]) -> float:
    """Seconds a decode step of all `prompts` takes in the serving engine (their prefill excluded)."""
    engine = LLMEngine(model, args=EngineArgs(max_num_seqs=len(prompts), max_num_batched_tokens=len(prompts) * PROMPT,
                                              kv_cache_bytes=256 << 20), eos_token_ids=[])
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS + 1, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, params)
    engine.step()  # every prompt's prefill and first token
    start, steps = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    assert steps == NEW_TOKENS
    return (time.perf_counter() - start) / steps


def transformers_step(hf, prompts: list[list[int]]) -> float:
    """Seconds a decode step of `generate()` takes on the batch `prompts`."""
    ids = torch.tensor(prompts)

    def run(new: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        assert out.shape[1] == ids.shape[1] + new
        return time.perf_counter() - start

    return (run(NEW_TOKENS + 1) - run(1)) / NEW_TOKENS


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    config = Glm4MoeConfig(**AIR_SHAPED)
    torch.manual_seed(0)
    hf = HfGlm4Moe(config).eval()
    params = sum(p.numel() for p in hf.parameters())
    expert = 3 * config.hidden_size * config.moe_intermediate_size
    moe_layers = config.num_hidden_layers - config.first_k_dense_replace
    active = params - moe_layers * (config.n_routed_experts - config.num_experts_per_tok) * expert
    linear.FP32_PACKED_MAX_BYTES = max(linear.FP32_PACKED_MAX_BYTES, 3 * params * 4)
    with tempfile.TemporaryDirectory() as path:
        hf.save_pretrained(path)
        fp32 = load_model(path, ModelConfig.from_pretrained(path), "cpu")
        int8 = load_model(path, ModelConfig.from_pretrained(path, quantization="w8a16"), "cpu")
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(2, config.vocab_size, (BATCH, PROMPT), generator=g).tolist()
    print(f"GLM-4.5-Air-shaped MoE, random weights: {params / 1e6:.0f}M parameters ({active / 1e6:.0f}M active a "
          f"token), {config.num_hidden_layers} layers, {config.n_routed_experts} experts top-{config.num_experts_per_tok}"
          f" + {config.n_shared_experts} shared; {PROMPT}-token prompts, {NEW_TOKENS} decode steps")
    runs = {
        ("batch 1", "engine fp32"): lambda: engine_batch1(fp32, prompts[0]),
        ("batch 1", "engine int8"): lambda: engine_batch1(int8, prompts[0]),
        ("batch 1", "transformers"): lambda: transformers_step(hf, prompts[:1]),
        (f"batch {BATCH}", "engine fp32"): lambda: engine_batched(fp32, prompts),
        (f"batch {BATCH}", "engine int8"): lambda: engine_batched(int8, prompts),
        (f"batch {BATCH}", "transformers"): lambda: transformers_step(hf, prompts),
    }
    for run in runs.values():  # warm-up: first calls choose kernels and make weight copies
        run()
    times: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for _ in range(ROUNDS):
        for key, run in runs.items():
            times[key].append(run())
    print(f"\n{'':>10} {'':>14} {'step ms':>9} {'tok/s':>9} {'x transformers':>15} {'x fp32':>8}")
    for key in runs:
        batch, name = key
        size = 1 if batch == "batch 1" else BATCH
        step = statistics.median(times[key])
        hf_ratio = statistics.median(h / e for h, e in zip(times[(batch, "transformers")], times[key], strict=True))
        fp32_ratio = statistics.median(f / e for f, e in zip(times[(batch, "engine fp32")], times[key], strict=True))
        print(f"{batch:>10} {name:>14} {step * 1e3:9.2f} {size / step:9.1f} {hf_ratio:14.2f}x {fp32_ratio:7.2f}x")
    print(f"(medians of {ROUNDS} interleaved rounds; the ratios are medians of the rounds' paired ratios)")


if __name__ == "__main__":
    main()
