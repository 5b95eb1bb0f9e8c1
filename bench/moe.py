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

`python -m bench.moe flash` runs the GLM-4.7-Flash section alone (`flash_main`, issue #22): a
scaled-down GLM-4.7-Flash (glm4_moe_lite: Multi-head Latent Attention over a cache of latents +
the same MoE) decode at batch 1 and 16 against transformers `generate()`, and its KV bytes per
token against per-head K/V. `python -m bench.moe mtp` runs the MTP section alone (`mtp_main`):
the same model with an MTP layer written in as the published checkpoints carry it, speculative
decoding against plain (greedy, one request, and the serving engine at batch 16). No argument
runs them all; `python -m bench.moe next` runs GLM-5.3-Flash's alone (bench/moe_next.py, issue #54).
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import Glm4MoeConfig, Glm4MoeLiteConfig
from transformers import Glm4MoeForCausalLM as HfGlm4Moe
from transformers import Glm4MoeLiteForCausalLM as HfGlm4MoeLite

from inference.config import ModelConfig
from inference.engine import EngineArgs, LLMEngine
from inference.layers import linear
from inference.layers.caches.layouts import cache_layout
from inference.llm import LLM
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
    moe_layers = config.num_hidden_layers - config.first_k_dense_replace
    _, runs, params, active = engine_runs(hf, config, moe_layers)
    print(f"GLM-4.5-Air-shaped MoE, random weights: {params / 1e6:.0f}M parameters ({active / 1e6:.0f}M active a "
          f"token), {config.num_hidden_layers} layers, {config.n_routed_experts} experts top-{config.num_experts_per_tok}"
          f" + {config.n_shared_experts} shared; {PROMPT}-token prompts, {NEW_TOKENS} decode steps")
    report(runs)


def engine_runs(hf, config, moe_layers: int) -> tuple:
    """The engine's fp32 and int8 copies of `hf`'s weights, and the six timed runs (batch 1 and
    `BATCH`: engine fp32, engine int8, transformers) on the same prompts; with the fp32 model, the
    parameter count and the parameters a token reads (one token's experts only)."""
    params = sum(p.numel() for p in hf.parameters())
    expert = 3 * config.hidden_size * config.moe_intermediate_size
    active = params - moe_layers * (config.n_routed_experts - config.num_experts_per_tok) * expert
    linear.FP32_PACKED_MAX_BYTES = max(linear.FP32_PACKED_MAX_BYTES, 3 * params * 4)
    with tempfile.TemporaryDirectory() as path:
        hf.save_pretrained(path)
        fp32 = load_model(path, ModelConfig.from_pretrained(path), "cpu")
        int8 = load_model(path, ModelConfig.from_pretrained(path, quantization="w8a16"), "cpu")
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(2, config.vocab_size, (BATCH, PROMPT), generator=g).tolist()
    runs = {
        ("batch 1", "engine fp32"): lambda: engine_batch1(fp32, prompts[0]),
        ("batch 1", "engine int8"): lambda: engine_batch1(int8, prompts[0]),
        ("batch 1", "transformers"): lambda: transformers_step(hf, prompts[:1]),
        (f"batch {BATCH}", "engine fp32"): lambda: engine_batched(fp32, prompts),
        (f"batch {BATCH}", "engine int8"): lambda: engine_batched(int8, prompts),
        (f"batch {BATCH}", "transformers"): lambda: transformers_step(hf, prompts),
    }
    return fp32, runs, params, active


# -- GLM-4.7-Flash (glm4_moe_lite, issue #22) ---------------------------------------------------

FLASH_SHAPED = dict(  # GLM-4.7-Flash: hidden 2048, 47 layers, 20 heads, q_lora 768, kv_lora 512, nope 192,
    # rope 64, v 256, 64 experts of 1536 top-4 + 1 shared; here the attention widths a quarter, 8 heads
    vocab_size=32000, hidden_size=512, intermediate_size=2560, num_hidden_layers=8, num_attention_heads=8,
    num_key_value_heads=8, q_lora_rank=192, kv_lora_rank=128, qk_nope_head_dim=48, qk_rope_head_dim=16,
    v_head_dim=64, moe_intermediate_size=384, n_routed_experts=64, num_experts_per_tok=4, n_shared_experts=1,
    n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.8, pad_token_id=0, eos_token_id=[1],
)
FLASH_CONFIG = Path(__file__).resolve().parents[1] / "inference" / "configs" / "glm-4.7-flash.json"


def kv_bytes_lines(model) -> list[str]:
    """Bytes per token of the engine's bf16 pools (what the layout reports, and what they allocate)
    against the K/V the same attention would cache per head (GQA with the config's
    num_key_value_heads, which equals the heads here), for this model and the published
    GLM-4.7-Flash config; for the latter also against a GLM-4.5-Air-style GQA cache (8 kv heads x
    128) of as many layers."""
    lines = []
    flash = ModelConfig.from_dict(json.loads(FLASH_CONFIG.read_text()))
    for name, c in [("bench model", model.config), ("GLM-4.7-Flash", flash)]:
        latent = cache_layout(c).bytes_per_token(torch.bfloat16)
        kv_heads = c.num_key_value_heads
        gqa = c.num_hidden_layers * kv_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim) * 2
        line = (f"{name:>14}: MLA latent {latent:>7,} B/token ({c.kv_lora_rank}+{c.qk_rope_head_dim} values x "
                f"{c.num_hidden_layers} layers x 2 B); per-head K/V of {kv_heads} kv heads {gqa:>9,} ({gqa / latent:.1f}x)")
        if c is flash:
            air = c.num_hidden_layers * 2 * 8 * 128 * 2
            line += f"; GQA 8 x 128 {air:,} ({air / latent:.1f}x)"
        lines.append(line)
    pools = cache_layout(model.config).paged_cache(4, 64, torch.bfloat16, torch.device("cpu"))
    lines.append(f"{'':>14}  the bench model's bf16 pools allocate {pools.nbytes() // (4 * 64):,} B per token slot")
    return lines


def flash_main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    config = Glm4MoeLiteConfig(**FLASH_SHAPED)
    torch.manual_seed(0)
    hf = HfGlm4MoeLite(config).eval()
    fp32, runs, params, active = engine_runs(hf, config, config.mlp_layer_types.count("sparse"))
    print(f"GLM-4.7-Flash-shaped MLA + MoE, random weights: {params / 1e6:.0f}M parameters ({active / 1e6:.0f}M "
          f"active a token), {config.num_hidden_layers} layers, {config.num_attention_heads} heads, kv_lora_rank "
          f"{config.kv_lora_rank}, {config.n_routed_experts} experts top-{config.num_experts_per_tok}; {PROMPT}-token "
          f"prompts, {NEW_TOKENS} decode steps")
    report(runs)
    print("\nKV cache per token:")
    print("\n".join(kv_bytes_lines(fp32)))


# -- MTP speculative decoding (issue #22) --------------------------------------------------------

MTP_TOKENS, MTP_KS = 64, (1, 2, 3, 4)


def write_mtp_layer(path: str, drafts_follow: bool) -> None:
    """Write layer `num_hidden_layers` (GLM's MTP layer, under the published names) into the
    checkpoint at `path`: a copy of its last decoder layer plus `enorm`, `hnorm`, `eh_proj` and
    `shared_head.norm`. Random weights make drafts nobody would accept, which only times the
    machinery: with `drafts_follow` the model is made predictable and the layer made to predict
    it. Every layer's writes to the residual stream are scaled down 1000x, so that the model's next
    token is a fixed function f of its current one (the last hidden state is mostly that token's
    embedding), and `eh_proj` is [I ; 0]: the layer carries the next token's embedding to the
    shared head, which then says f(next), the token after next, as the model will. The model still
    does all its work a step; only what it computes is simple."""
    file = Path(path) / "model.safetensors"
    state = load_file(file)
    config = ModelConfig.from_pretrained(path)
    layers, hidden = config.num_hidden_layers, config.hidden_size
    if drafts_follow:
        for name in state:
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                state[name] = state[name] / 1000
    g = torch.Generator().manual_seed(3)
    last, m = f"model.layers.{layers - 1}.", f"model.layers.{layers}."
    mtp = {m + name.removeprefix(last): t.clone() for name, t in state.items() if name.startswith(last)}
    for norm in ("enorm", "hnorm"):
        mtp[f"{m}{norm}.weight"] = torch.ones(hidden)
    mtp[f"{m}shared_head.norm.weight"] = state["model.norm.weight"].clone()
    mtp[f"{m}eh_proj.weight"] = (torch.cat((torch.eye(hidden), torch.zeros(hidden, hidden)), dim=1) if drafts_follow
                                 else torch.randn(hidden, 2 * hidden, generator=g) / (2 * hidden) ** 0.5)
    save_file({**state, **mtp}, file, metadata={"format": "pt"})


def timed_generation(llm: LLM, prompt: list[int], k: int) -> tuple[float, object]:
    """Seconds of one request alone on the engine, and the speculative rounds it ran."""
    params = SamplingParams(temperature=0, max_tokens=MTP_TOKENS, ignore_eos=True)
    before = copy.deepcopy(llm.speculative_stats)
    start = time.perf_counter()
    llm.generate([prompt], params, speculative_k=k)
    return time.perf_counter() - start, llm.speculative_stats.since(before)


def timed_engine(model, prompts: list[list[int]], k: int) -> tuple[float, object]:
    params = SamplingParams(temperature=0, max_tokens=MTP_TOKENS, ignore_eos=True)
    args = EngineArgs(max_num_seqs=BATCH, speculative_k=k, max_model_len=PROMPT + MTP_TOKENS + 16)
    engine = LLMEngine(model, args=args, eos_token_ids=[])
    for prompt in prompts:
        engine.add_request(prompt, params)
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start, engine.speculative_stats


def mtp_main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    config = Glm4MoeLiteConfig(**FLASH_SHAPED)
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(2, config.vocab_size, (BATCH, PROMPT), generator=g).tolist()
    print(f"GLM-4.7-Flash-shaped (bench.moe flash's model) with an MTP layer; greedy, {PROMPT}-token prompts, "
          f"{MTP_TOKENS} new tokens (prefill included); fp32")
    print(f"\n{'MTP layer':>22} {'':>9} {'k':>2} {'s':>7} {'tok/s':>8} {'x plain':>8} {'accepted':>9} {'tok/round':>10}")
    for drafts_follow in (True, False):
        torch.manual_seed(0)
        hf = HfGlm4MoeLite(config).eval()
        with tempfile.TemporaryDirectory() as path:
            hf.save_pretrained(path)
            write_mtp_layer(path, drafts_follow)
            model = load_model(path, ModelConfig.from_pretrained(path), "cpu")
        llm = LLM(model, args=EngineArgs(max_num_seqs=1, max_model_len=PROMPT + MTP_TOKENS + 16), eos_token_ids=[])
        name = "drafts that follow" if drafts_follow else "random (rejected)"
        timed_generation(llm, prompts[0], 2)  # warm-up
        plain = statistics.median(timed_generation(llm, prompts[0], 0)[0] for _ in range(ROUNDS))
        print(f"{name:>22} {'batch 1':>9} {0:>2} {plain:7.2f} {MTP_TOKENS / plain:8.1f} {1:8.2f}x {'':>9} {'':>10}")
        for k in MTP_KS:
            runs = [timed_generation(llm, prompts[0], k) for _ in range(ROUNDS)]
            took = statistics.median(t for t, _ in runs)
            stats = runs[0][1]
            rate = sum(stats.accepted) / max(1, sum(stats.proposed))
            print(f"{name:>22} {'batch 1':>9} {k:>2} {took:7.2f} {MTP_TOKENS / took:8.1f} {plain / took:7.2f}x "
                  f"{rate:8.0%} {stats.emitted / max(1, stats.rounds):10.2f}")
        plain_b, _ = timed_engine(model, prompts, 0)
        print(f"{name:>22} {f'batch {BATCH}':>9} {0:>2} {plain_b:7.2f} {BATCH * MTP_TOKENS / plain_b:8.1f} "
              f"{1:8.2f}x {'':>9} {'':>10}")
        took, stats = timed_engine(model, prompts, 2)
        rate = sum(stats.accepted) / max(1, sum(stats.proposed))
        print(f"{name:>22} {f'batch {BATCH}':>9} {2:>2} {took:7.2f} {BATCH * MTP_TOKENS / took:8.1f} "
              f"{plain_b / took:7.2f}x {rate:8.0%} {stats.emitted / max(1, stats.rounds):10.2f}")
    print(f"(batch 1: medians of {ROUNDS} runs; batch {BATCH}: the serving engine, one run each)")


def report(runs: dict) -> None:
    """Warm each run up, time them in interleaved rounds and print the medians."""
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
    import sys

    from bench.moe_next import next_main

    sections = {"air": main, "flash": flash_main, "mtp": mtp_main, "next": next_main}
    for name in sys.argv[1:] or sections:
        sections[name]()
