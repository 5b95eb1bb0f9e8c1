"""GLM-5.3-Flash's (`glm5_next`) config fields, read from its `config.json` (the text part of
`Glm5NextConfig`, `text_config`, or a flat text-only one) with transformers 5.24's defaults, and
the checks the model needs. A leaf module: `inference.config` calls it for this model type."""

from __future__ import annotations

LAYER_KINDS = ("linear_attention", "indexed_attention")


def text_fields(raw: dict) -> tuple[dict, dict]:
    """(`raw` with the text config's fields at the top, the glm5_next fields of `ModelConfig`)."""
    nested = isinstance(raw.get("text_config"), dict)
    text = {**raw["text_config"]} if nested else {**raw}
    for key in ("eos_token_id", "dtype", "torch_dtype", "quantization", "tie_word_embeddings"):
        if key in raw:  # the outer config's (generation_config's eos, transformers' tying) win
            text[key] = raw[key]
    text["model_type"] = "glm5_next"
    text["head_dim"] = 1  # no rotary anywhere (transformers sets head_dim to qk_rope_head_dim, 0)
    layers = text["num_hidden_layers"]
    text.setdefault("mlp_layer_types", ["dense"] * min(3, layers) + ["sparse"] * max(layers - 3, 0))
    kinds = text.get("layer_types") or ["linear_attention" if i % 4 != 3 else "indexed_attention"
                                        for i in range(layers)]
    linear = text.get("linear_attn_config") or {}
    lower = linear.get("gate_lower_bound", text.get("linear_lower_bound", -5.0))
    if lower is None and linear.get("safe_gate", True) and linear:
        lower = -5.0
    fields = {
        "layer_types": ["indexed_attention" if k == "full_attention" else k for k in kinds],
        "linear_num_heads": linear.get("num_heads", text.get("linear_num_heads", 64)),
        "linear_head_dim": linear.get("head_dim", text.get("linear_head_dim", 128)),
        "linear_conv_kernel_dim": linear.get("short_conv_kernel_size", text.get("linear_conv_kernel_dim", 4)),
        "linear_lower_bound": lower,
        "hc_mult": text.get("hc_mult", 4),
        "hc_eps": text.get("hc_eps", 1e-6),
        "hc_sinkhorn_iters": text.get("hc_sinkhorn_iters", 20),
        "swiglu_limit": text.get("swiglu_limit", 10.0),
        "index_kpool": text.get("index_kpool", 16),
        "index_kpool_always_select_tail": text.get("index_kpool_always_select_tail", True),
        "q_lora_rank": text.get("q_lora_rank", 1536),
        "kv_lora_rank": text.get("kv_lora_rank", 512),
        "qk_nope_head_dim": text.get("qk_nope_head_dim", 256),
        "qk_rope_head_dim": text.get("qk_rope_head_dim", 0),
        "v_head_dim": text.get("v_head_dim", 256),
        "num_nextn_predict_layers": 0,  # the MTP layer a checkpoint carries is not loaded (yet)
        "checkpoint_prefix": "model.language_model." if nested else "model.",
    }
    return text, fields


def validate(config) -> None:
    """What the model needs of a glm5_next `ModelConfig`; a clear `ValueError` otherwise."""
    layers = config.num_hidden_layers
    if len(config.layer_types) != layers or any(k not in LAYER_KINDS for k in config.layer_types):
        raise ValueError(f"layer_types needs one of {LAYER_KINDS} for each of the {layers} layers, "
                         f"got {config.layer_types!r}")
    if "indexed_attention" not in config.layer_types:
        # transformers' cache cannot run such a model, and the engine sizes its blocks by these layers
        raise ValueError("glm5_next needs at least one indexed_attention (sparse) layer")
    if "linear_attention" in config.layer_types and not (
            config.linear_num_heads > 0 and config.linear_head_dim > 0 and config.linear_conv_kernel_dim > 1):
        raise ValueError("KDA layers need linear_num_heads, linear_head_dim > 0 and linear_conv_kernel_dim > 1")
    if config.hc_mult < 1 or config.hc_sinkhorn_iters < 1:
        raise ValueError("hc_mult and hc_sinkhorn_iters must be positive")
    if config.qk_rope_head_dim != 0 or config.q_lora_rank is None or config.kv_lora_rank <= 0:
        raise ValueError("glm5_next's sparse layers have no rotary part (qk_rope_head_dim 0), a q_lora_rank "
                         "and a kv_lora_rank")
    if config.num_attention_heads != config.num_key_value_heads:
        raise ValueError("glm5_next needs num_key_value_heads == num_attention_heads")
    if config.index_kpool < 1 or config.index_topk % config.index_kpool:
        raise ValueError(f"index_topk ({config.index_topk}) must be a multiple of index_kpool ({config.index_kpool})")
    for i, kind in enumerate(config.layer_types):
        shared = kind == "indexed_attention" and config.indexer_types[i] == "shared"
        if shared and (i == 0 or config.layer_types[i - 1] != "indexed_attention"
                       or config.indexer_types[i - 1] != "full"):
            # transformers hands a full layer's choice to the next layer only
            raise ValueError(f"layer {i} shares its sparse choice, but layer {i - 1} is no full sparse layer")
