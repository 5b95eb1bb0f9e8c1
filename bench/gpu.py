"""The engine on one GPU, in one run: `python -m bench.gpu` (under 8 minutes on one H200), or
`python -m bench.gpu --smoke` (a tiny model on the CPU, under a minute: what CI can run).

Prints, for random bf16 weights saved by transformers (so the engine loads them as it would a
checkpoint):
1. the device's copy bandwidth (a 2 GiB tensor copied; read + write bytes over the time);
2. a ~1B-parameter GLM-4-shaped model (hidden 2048, 16 layers, GQA 16/4 x 128, vocab 64k):
   decode tokens/s through the serving engine (`LLMEngine`: paged KV, continuous batching, the
   batched Triton decode attention) at batch 1, 8, 64 and 256, greedy, prefill excluded (the
   steps after every sequence got its first token); at batch 1 the percent of the bandwidth
   bound (weight bytes read per token against the copy bandwidth);
3. transformers `generate()` on the same weights at batch 1 and 64 (its decode steps only, as the
   difference between NEW_TOKENS tokens and 1);
4. the engine with int8 (W8A16) weights against bf16 at batch 1 and 64;
5. prefill tokens/s of one 4k and one 32k prompt;
6. when `--moe`: a GLM-4.7-Flash-shaped MoE (MLA + 64 experts top-4), decode at batch 1 and 64.
7. CUDA graphs on and off: decode at batch 1 and 64 with the engine's captured decode steps
   (the default on CUDA) against `enforce_eager` (every step launched from Python).
The engine figures above are with CUDA graphs (the default); off the GPU nothing is captured.

Targets (issue #27): batch 1 >= 70 % of the bandwidth bound, batch 64 >= 10x batch 1's
throughput, >= 3x transformers. Every figure is from this one run; compare only within it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from transformers import Glm4Config, Glm4ForCausalLM, Glm4MoeLiteConfig, Glm4MoeLiteForCausalLM

from inference.config import ModelConfig
from inference.engine import EngineArgs, LLMEngine
from inference.loader import load_model
from inference.sampling_params import SamplingParams

DENSE = dict(vocab_size=65536, hidden_size=2048, intermediate_size=6144, num_hidden_layers=16,
             num_attention_heads=16, num_key_value_heads=4, head_dim=128, pad_token_id=0, eos_token_id=[1])
MOE = dict(vocab_size=65536, hidden_size=2048, intermediate_size=6144, num_hidden_layers=12, num_attention_heads=20,
           num_key_value_heads=20, q_lora_rank=768, kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64,
           v_head_dim=256, moe_intermediate_size=1536, n_routed_experts=64, num_experts_per_tok=4,
           n_shared_experts=1, n_group=1, topk_group=1, norm_topk_prob=True, pad_token_id=0, eos_token_id=[1])
# each engine's paged cache: room for 256 x 264 positions of the dense model (2.2 GB) or one 32k
# prompt, without taking the GPU's memory share anew for every engine the run makes
KV_BYTES = {"cuda": 8 * 2**30, "cpu": 64 * 2**20}
SMOKE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, pad_token_id=0, eos_token_id=[1])
SMOKE_MOE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                 v_head_dim=16, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
                 n_shared_experts=1, n_group=1, topk_group=1, pad_token_id=0, eos_token_id=[1])


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, gib: float) -> float:
    """Bytes moved per second (read + write) copying a `gib` GiB tensor, best of 5."""
    src = torch.empty(int(gib * 2**30) // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(5):
        sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * src.element_size() / best


EAGER = {"all": False}  # set when capturing CUDA graphs fails: the run goes on without them
LAST = {"steps": 0, "replayed": 0}  # the last engine_decode's steps, and how many replayed a graph


def compared_batches(args) -> tuple[int, int]:
    """The two batch sizes the comparisons run at: the smallest and the third (1 and 64)."""
    return args.batches[0], args.batches[min(2, len(args.batches) - 1)]


def graphs_usable(model) -> None:
    """Check that the engine captures and replays its decode graphs here; if not, say why and
    have the rest of the run go eager (its figures are then without graphs), so the one run a
    GPU allows still measures everything else."""
    try:
        engine = LLMEngine(model, args=EngineArgs(max_num_seqs=2, max_model_len=64, kv_cache_bytes=2**26),
                           eos_token_ids=[])
        engine.generate([[3, 4, 5], [6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    except Exception as error:  # noqa: BLE001 - any failure: report it and measure the rest
        print(f"CUDA graphs FAILED ({type(error).__name__}: {error}); every figure below is eager")
        EAGER["all"] = True


def engine_decode(model, batch: int, prompt: int, new: int, eager: bool = False) -> float:
    """Decode tokens/s of `batch` greedy requests through the serving engine, counted from the
    step after every request got its first token to the last. `eager`: no CUDA graphs."""
    engine = LLMEngine(model, args=EngineArgs(max_num_seqs=batch, max_num_batched_tokens=max(8192, batch * prompt),
                                              max_model_len=prompt + new + 8, kv_cache_bytes=KV_BYTES[model.device.type],
                                              enforce_eager=eager or EAGER["all"]),
                       eos_token_ids=[])
    g = torch.Generator().manual_seed(batch)
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    for ids in torch.randint(3, model.config.vocab_size, (batch, prompt), generator=g).tolist():
        engine.add_request(ids, params)
    started, tokens, device = None, 0, model.device
    LAST["steps"] = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        LAST["steps"] += 1
        if started is None:
            if all(len(o.token_ids) >= 1 for o in outputs) and len(outputs) == batch:
                sync(device)
                started = time.perf_counter()
            continue
        tokens += sum(len(o.new_token_ids) for o in outputs)
    sync(device)
    LAST["replayed"] = engine.runner.graphs.replays if engine.runner.graphs is not None else 0
    return tokens / (time.perf_counter() - started)


def hf_decode(hf, batch: int, prompt: int, new: int, device: torch.device) -> float:
    """transformers generate(): decode tokens/s (generating `new` tokens minus generating 1)."""
    ids = torch.randint(3, hf.config.vocab_size, (batch, prompt), device=device)

    def run(n: int) -> float:
        sync(device)
        start = time.perf_counter()
        with torch.no_grad():
            hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        sync(device)
        return time.perf_counter() - start

    run(2)
    return batch * (new - 1) / (run(new) - run(1))


def prefill(model, tokens: int) -> float:
    engine = LLMEngine(model, args=EngineArgs(max_num_seqs=1, max_num_batched_tokens=tokens,
                                              max_model_len=tokens + 8, enable_prefix_caching=False,
                                              kv_cache_bytes=KV_BYTES[model.device.type]), eos_token_ids=[])
    ids = torch.randint(3, model.config.vocab_size, (tokens,)).tolist()
    engine.add_request(ids, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    sync(model.device)
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    sync(model.device)
    return tokens / (time.perf_counter() - start)


def weight_bytes(model) -> int:
    """What a decode step reads: every parameter but the embedding table (one row of it is read)."""
    embed = model.model.embed_tokens.weight
    return sum(p.numel() * p.element_size() for p in model.parameters()) - embed.numel() * embed.element_size()


def dense_section(args, device: torch.device, bandwidth: float) -> None:
    shape = SMOKE if args.smoke else DENSE
    torch.manual_seed(0)
    hf = Glm4ForCausalLM(Glm4Config(**shape)).to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as path:
        hf.save_pretrained(path)
        bf16 = load_model(path, ModelConfig.from_pretrained(path), device)
        int8 = load_model(path, ModelConfig.from_pretrained(path, quantization="w8a16"), device)
    hf = hf.to(device).eval()
    if device.type == "cuda":
        graphs_usable(bf16)
    params = sum(p.numel() for p in bf16.parameters())
    read = weight_bytes(bf16)
    bound = bandwidth / read
    print(f"\nGLM-4-shaped, random bf16 weights: {params / 1e9:.2f}B parameters, {read / 2**20:.0f} MiB read a decode "
          f"step: bandwidth bound {bound:.0f} tok/s at batch 1")
    print(f"{'':>22} {'batch':>6} {'tok/s':>10} {'x batch 1':>10} {'note':>30}")
    rates = {}
    for batch in args.batches:
        rates[batch] = statistics.median(engine_decode(bf16, batch, args.prompt, args.new) for _ in range(args.rounds))
        note = f"{rates[batch] / bound:.0%} of the bound" if batch == 1 else ""
        print(f"{'engine bf16':>22} {batch:>6} {rates[batch]:10.1f} {rates[batch] / rates[args.batches[0]]:9.1f}x "
              f"{note:>30}")
    print(f"{'':>22} (the last run: {LAST['replayed']} of its {LAST['steps']} steps replayed a CUDA graph)")
    for batch in compared_batches(args):
        theirs = hf_decode(hf, batch, args.prompt, args.new, device)
        print(f"{'transformers bf16':>22} {batch:>6} {theirs:10.1f} {'':>10} {f'engine {rates[batch] / theirs:.2f}x':>30}")
        mine = statistics.median(engine_decode(int8, batch, args.prompt, args.new) for _ in range(args.rounds))
        print(f"{'engine int8 (W8A16)':>22} {batch:>6} {mine:10.1f} {'':>10} {f'{mine / rates[batch]:.2f}x bf16':>30}")
    if device.type != "cuda" or EAGER["all"]:
        print(f"{'CUDA graphs':>22}: not captured (off the GPU, or the capture failed); nothing to compare")
    else:
        for batch in compared_batches(args):
            eager = statistics.median(engine_decode(bf16, batch, args.prompt, args.new, eager=True)
                                      for _ in range(args.rounds))
            print(f"{'engine bf16 eager':>22} {batch:>6} {eager:10.1f} {'':>10} "
                  f"{f'CUDA graphs {rates[batch] / eager:.2f}x eager':>30}")
    for tokens in args.prefill:
        print(f"{'prefill':>22} {tokens:>6} {prefill(bf16, tokens):10.0f} tok/s (one prompt of {tokens} tokens)")


def moe_section(args, device: torch.device) -> None:
    torch.manual_seed(0)
    hf = Glm4MoeLiteForCausalLM(Glm4MoeLiteConfig(**(SMOKE_MOE if args.smoke else MOE))).to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as path:
        hf.save_pretrained(path)
        model = load_model(path, ModelConfig.from_pretrained(path), device)
    params = sum(p.numel() for p in model.parameters())
    print(f"\nGLM-4.7-Flash-shaped (MLA + MoE), random bf16 weights: {params / 1e9:.2f}B parameters")
    for batch in compared_batches(args):
        rate = statistics.median(engine_decode(model, batch, args.prompt, args.new) for _ in range(args.rounds))
        print(f"{'engine bf16':>22} {batch:>6} {rate:10.1f} tok/s  ({LAST['replayed']} of {LAST['steps']} steps "
              f"replayed a CUDA graph)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu")
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU (for CI)")
    parser.add_argument("--moe", action="store_true", help="also the GLM-4.7-Flash-shaped MoE")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    if args.smoke:
        args.batches, args.prompt, args.new, args.rounds, args.prefill = (1, 2, 4), 16, 8, 1, (64,)
    else:
        args.batches, args.prompt, args.new, args.rounds, args.prefill = (1, 8, 64, 256), 128, 128, 3, (4096, 32768)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__}, {name}{' (smoke: tiny shapes)' if args.smoke else ''}")
    bandwidth = copy_bandwidth(device, 0.0625 if args.smoke else 2.0)
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s (read + write)")
    dense_section(args, device, bandwidth)
    if args.moe or args.smoke:
        moe_section(args, device)


if __name__ == "__main__":
    main()
