"""`python -m inference plan` for GLM-5.3-Flash (`glm5_next`, a hybrid of KDA linear attention and
pooled DSA over MLA; inference/models/glm5_next.py): weights, the cache a token and the state a
sequence, and how many sequences fit one GPU.

Its cache has two parts (inference/layers/caches/hybrid.py): per position and sparse layer one
latent row (`kv_lora_rank`; no rotary part) plus, in a layer running its own indexer, the pool
keys' inputs (`2 x index_head_dim`: the key and the pool gate), bf16; and per sequence and KDA
layer a fixed state, fp32, whatever the context: the convolution's last `kernel - 1` inputs of
q, k and v (`3 x heads x head_dim x (kernel - 1)`) and the delta rule's `heads x head_dim x
head_dim`. A sequence of n tokens takes `n x per_token + per_sequence`: at long contexts the
linear layers cost nothing more, which is what the model is built for.

Weight bytes follow `inference.plan`'s rules per dtype (decoder-layer linears quantize; norms,
router, indexer, gates and hyper-connection mixers do not; the KDA gates' `dt_bias`/`A_log`, the
convolutions and the mixers' `base`/`scale` are fp32 as transformers keeps them). The MTP layer
the checkpoint carries and the vision tower are left out (the engine loads neither).
"""

from __future__ import annotations

from dataclasses import dataclass

from inference.config_glm5_next import text_fields
from inference.plan_tensors import (
    BF16,
    EMBED,
    FP32,
    GIB,
    HEAD,
    LATENT,
    LINEAR,
    PlanError,
    Tensor,
    tensor_bytes,
)

STATE_BYTES = 4  # the KDA states are fp32
CACHE_BYTES = 2  # the positions' rows, bf16
CONTEXTS = (4096, 32768)  # the contexts whose per-sequence bytes the report shows side by side


def _linear(name: str, out: int, inp: int, kind: str = LINEAR, **kw) -> Tensor:
    return Tensor(f"{name}.weight", (out, inp), kind, **kw)


def _layer(c: dict, f: dict, i: int) -> list[Tensor]:
    p, h = f"layers.{i}", c["hidden_size"]
    n = f["hc_mult"]
    out = [Tensor(f"{p}.hc_{part}_fn", ((2 + n) * n, n * h), BF16) for part in ("attn", "ffn")]
    out += [Tensor(f"{p}.hc_{part}_{w}", (size,), FP32) for part in ("attn", "ffn")
            for w, size in (("base", (2 + n) * n), ("scale", 3))]
    out += [Tensor(f"{p}.{norm}.weight", (h,), BF16) for norm in ("input_layernorm", "post_attention_layernorm")]
    a = f"{p}.self_attn"
    if f["layer_types"][i] == "linear_attention":
        heads, dim, taps = f["linear_num_heads"], f["linear_head_dim"], f["linear_conv_kernel_dim"]
        width = heads * dim
        out += [_linear(f"{a}.{x}_proj", width, h) for x in "qkv"]
        out += [Tensor(f"{a}.{x}_conv1d.weight", (width, 1, taps), FP32) for x in "qkv"]
        out += [_linear(f"{a}.f_a_proj", dim, h), _linear(f"{a}.f_b_proj", width, dim),
                Tensor(f"{a}.dt_bias", (width,), FP32), Tensor(f"{a}.A_log", (heads,), FP32),
                _linear(f"{a}.b_proj", heads, h), _linear(f"{a}.g_a_proj", dim, h), _linear(f"{a}.g_b_proj", width, dim),
                Tensor(f"{a}.o_norm.weight", (dim,), BF16), _linear(f"{a}.o_proj", h, width)]
    else:
        heads, rank, nope, v = c["num_attention_heads"], f["kv_lora_rank"], f["qk_nope_head_dim"], f["v_head_dim"]
        q = f["q_lora_rank"]
        out += [_linear(f"{a}.q_a_proj", q, h), Tensor(f"{a}.q_a_layernorm.weight", (q,), BF16),
                _linear(f"{a}.q_b_proj", heads * nope, q), _linear(f"{a}.kv_a_proj_with_mqa", rank, h),
                Tensor(f"{a}.kv_a_layernorm.weight", (rank,), BF16),
                _linear(f"{a}.kv_b_proj", heads * (nope + v), rank, LATENT), _linear(f"{a}.o_proj", h, heads * v)]
        if c["indexer_types"][i] == "full":
            ih, d, x = c["index_n_heads"], c["index_head_dim"], f"{a}.indexer"
            out += [_linear(f"{x}.wq_b", ih * d, q, BF16), _linear(f"{x}.wk", d, h, BF16),
                    Tensor(f"{x}.k_norm.weight", (d,), BF16), Tensor(f"{x}.k_norm.bias", (d,), BF16),
                    _linear(f"{x}.weights_proj", ih, h, BF16), Tensor(f"{x}.index_kpool_compress_ape",
                                                                    (f["index_kpool"], d), BF16),
                    Tensor(f"{x}.index_kpool_compress_gate", (d, h), BF16)]
    m = f"{p}.mlp"
    if c["mlp_layer_types"][i] == "sparse":
        inter, experts = c["moe_intermediate_size"], c["n_routed_experts"]
        kw = {"copies": experts, "active": c["num_experts_per_tok"]}
        out += [_linear(f"{m}.experts.E.{x}_proj", inter, h, **kw) for x in ("gate", "up")]
        out += [_linear(f"{m}.experts.E.down_proj", h, inter, **kw)]
        shared = inter * c.get("n_shared_experts", 1)
        out += [_linear(f"{m}.shared_experts.{x}_proj", shared, h) for x in ("gate", "up")]
        out += [_linear(f"{m}.shared_experts.down_proj", h, shared), _linear(f"{m}.gate", experts, h, BF16),
                Tensor(f"{m}.gate.e_score_correction_bias", (experts,), FP32)]
    else:
        inter = c["intermediate_size"]
        out += [_linear(f"{m}.{x}_proj", inter, h) for x in ("gate", "up")] + [_linear(f"{m}.down_proj", h, inter)]
    return out


@dataclass(frozen=True)
class HybridPlan:
    layers: int
    kda_layers: int
    sparse_layers: int
    full_layers: int
    params: int
    active_params: int
    weight_bytes: int
    per_token: int
    per_sequence: int
    gpu_bytes: int
    reserve_bytes: int
    context: int

    def sequence_bytes(self, context: int) -> int:
        return context * self.per_token + self.per_sequence

    @property
    def free_bytes(self) -> int:
        return self.gpu_bytes - self.reserve_bytes - self.weight_bytes

    @property
    def sequences(self) -> int:
        return max(self.free_bytes, 0) // self.sequence_bytes(self.context)


def make_plan(config: dict, dtype: str, gpu_mem_gib: float, context: int | None, reserve_gib: float) -> HybridPlan:
    try:
        c, f = text_fields(config)
        c.setdefault("indexer_types", ["full"] * c["num_hidden_layers"])
        every = [Tensor("embed_tokens.weight", (c["vocab_size"], c["hidden_size"]), EMBED),
                 Tensor("norm.weight", (c["hidden_size"],), BF16)]
        if not c.get("tie_word_embeddings", False):
            every.append(Tensor("lm_head.weight", (c["vocab_size"], c["hidden_size"]), HEAD))
        for i in range(c["num_hidden_layers"]):
            every += _layer(c, f, i)
    except KeyError as e:
        raise PlanError(f"config.json has no {e.args[0]!r} (needed for glm5_next)") from None
    kinds = f["layer_types"]
    sparse = [i for i, k in enumerate(kinds) if k == "indexed_attention"]
    full = [i for i in sparse if c["indexer_types"][i] == "full"]
    heads, dim, taps = f["linear_num_heads"], f["linear_head_dim"], f["linear_conv_kernel_dim"]
    state = (3 * heads * dim * (taps - 1) + heads * dim * dim) * STATE_BYTES
    context = context or c.get("max_position_embeddings") or 32768
    if context < 1 or not 0 <= reserve_gib < gpu_mem_gib:
        raise PlanError("--context must be at least 1, the reserve at least 0 and less than the GPU memory")
    return HybridPlan(
        layers=len(kinds), kda_layers=len(kinds) - len(sparse), sparse_layers=len(sparse), full_layers=len(full),
        params=sum(t.numel for t in every),
        active_params=sum(t.active_numel for t in every if t.kind != EMBED),
        weight_bytes=sum(tensor_bytes(t, dtype) for t in every),
        per_token=(len(sparse) * f["kv_lora_rank"] + len(full) * 2 * c["index_head_dim"]) * CACHE_BYTES,
        per_sequence=(len(kinds) - len(sparse)) * state, gpu_bytes=int(gpu_mem_gib * GIB),
        reserve_bytes=int(reserve_gib * GIB), context=int(context))


def render(p: HybridPlan, source: str, dtype: str) -> str:
    row = "  {:<17} {}".format
    per_context = ", ".join(f"{n // 1024}k: {p.sequence_bytes(n) / (1 << 20):,.1f} MiB" for n in CONTEXTS)
    lines = [
        f"{source}: glm5_next, {p.layers} layers ({p.kda_layers} KDA linear attention, {p.sparse_layers} sparse "
        f"MLA + pooled DSA indexer, {p.full_layers} of them indexing)",
        row("parameters", f"{p.params / 1e9:,.2f}B ({p.params:,}); {p.active_params / 1e9:,.2f}B active a token "
                          "(MTP layer and vision tower left out)"),
        row(f"weights ({dtype})", f"{p.weight_bytes / GIB:,.1f} GiB"),
        row("cache per token", f"{p.per_token / 1024:,.2f} KiB (bf16: the sparse layers' latent rows and "
                               "their indexers' pool-key inputs)"),
        row("state a sequence", f"{p.per_sequence / (1 << 20):,.2f} MiB (fp32 KDA states, the same at any context)"),
        row("a sequence at", per_context),
        row("GPU", f"{p.gpu_bytes / GIB:,.1f} GiB, {p.reserve_bytes / GIB:,.1f} GiB kept in reserve"),
    ]
    if p.free_bytes <= 0:
        return "\n".join(lines + [row("fit", "does not fit: the weights alone exceed the GPU less the reserve")])
    seqs = p.sequences
    verdict = f"fits: {seqs:,} concurrent sequences of {p.context:,} tokens" if seqs else \
        f"does not fit: not one sequence of {p.context:,} tokens"
    return "\n".join(lines + [row("free for cache", f"{p.free_bytes / GIB:,.1f} GiB"), row("fit", verdict)])


def run(config: dict, source: str, dtype: str, gpu_mem_gib: float, context: int | None,
        reserve_gib: float) -> tuple[int, str]:
    plan = make_plan(config, dtype, gpu_mem_gib, context, reserve_gib)
    return (0 if plan.sequences else 1), render(plan, source, dtype)
