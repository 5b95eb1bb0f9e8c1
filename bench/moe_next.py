"""`python -m bench.moe next`: GLM-5.3-Flash (`glm5_next`) decode on this machine (issue #54).

A scaled-down GLM-5.3-Flash of random weights saved by transformers in the published layout
(`Glm5NextForConditionalGeneration`, a one-block vision tower the engine does not load): the same
kind of model (three KDA linear-attention layers to one sparse MLA layer with a pooled DSA
indexer, four hyper-connection streams, clamped SwiGLU, a dense first layer then MoE layers of
64 experts top-8 + one shared), ~150M parameters. Decode tokens/s at batch 1 (the engine's model
and cache) and batch 16 (the serving engine), fp32 and int8, against transformers `generate()` on
the same weights (its torch reference of KDA: `flash-linear-attention` is not installed here, as
on most CPUs), prefill excluded on both sides; `bench.moe.report` times them interleaved. Then
the cache: per-token bytes of the sparse layers and the fixed KDA state a sequence, measured on
a sequence at 4k and at 32k positions (the state does not grow).
Target (#54): at least 2x transformers at batch 1 and 16.
"""

from __future__ import annotations

import torch
from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

from bench import moe
from inference.layers.caches.layouts import cache_layout

NEXT_SHAPED = dict(  # GLM-5.3-Flash (inference/configs/glm-5.3-flash.json): hidden 4096, 45 layers (3:1 KDA to
    # sparse), 64 KDA heads x 128, 64 MLA heads, kv_lora 512, nope/v 256, 288 experts of 2048 top-8, index 32 x 128,
    # pools of 16; here the widths an eighth, 8 layers, 64 experts
    vocab_size=32000, hidden_size=512, intermediate_size=1536, moe_intermediate_size=256, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=8, q_lora_rank=192, kv_lora_rank=128, qk_rope_head_dim=0,
    qk_nope_head_dim=64, v_head_dim=64, n_routed_experts=64, num_experts_per_tok=8, n_shared_experts=1,
    mlp_layer_types=["dense"] + ["sparse"] * 7, index_topk=32, index_head_dim=64, index_n_heads=8, index_kpool=8,
    linear_head_dim=64, linear_num_heads=8, linear_conv_kernel_dim=4, hc_mult=4, pad_token_id=0, eos_token_id=[1],
)
VISION = dict(depth=1, hidden_size=32, num_heads=2, out_hidden_size=512, intermediate_size=32,
              projection_intermediate_size=32, patch_size=14)


def state_lines(model) -> list[str]:
    """The cache a token and the KDA states a sequence, by the layout and measured on one
    sequence's cache at 4k and 32k positions (prefilled in chunks of 4096)."""
    layout = cache_layout(model.config)
    lines = [f"cache per token {layout.bytes_per_token(torch.float32):,} B (fp32 here: the sparse layers' latents and "
             f"pool-key inputs); KDA states a sequence {layout.bytes_per_sequence():,} B"]
    for length in (4096, 32768):
        cache = model.new_cache()
        with torch.inference_mode():
            for a in range(0, length, 4096):
                model(torch.randint(2, 32000, (4096,)), torch.arange(a, a + 4096), cache)
        kda = sum(layer.nbytes() for layer, kind in zip(cache.layers, model.config.layer_types, strict=True)
                  if kind == "linear_attention")
        lines.append(f"  a sequence of {length:>6,} positions: KDA states {kda:,} B, the whole cache {cache.nbytes():,} B")
    return lines


def next_main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    config = Glm5NextConfig(text_config=NEXT_SHAPED, vision_config=VISION)
    torch.manual_seed(0)
    hf = Glm5NextForConditionalGeneration(config).eval()
    text = config.text_config
    hf.visual = None  # not counted, not run (text prompts)
    fp32, runs, params, active = moe.engine_runs(hf, text, text.mlp_layer_types.count("sparse"))
    print(f"GLM-5.3-Flash-shaped KDA + pooled DSA + mHC + MoE, random weights: {params / 1e6:.0f}M parameters "
          f"({active / 1e6:.0f}M active a token), {text.num_hidden_layers} layers ({text.layer_types.count('linear_attention')}"
          f" KDA), {text.n_routed_experts} experts top-{text.num_experts_per_tok}; {moe.PROMPT}-token prompts, "
          f"{moe.NEW_TOKENS} decode steps")
    moe.report(runs)
    print("\n".join(state_lines(fp32)))
