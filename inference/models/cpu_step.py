"""One decode token of a single sequence through a whole model on CPU in fp32: one compiled call.

A decode step of the 132M GLM-4 of bench.engine reads 409 MiB of weights; between the streams of
those weights, layer by layer, ran the Python of each layer (its module call, its plan check, its
cache bookkeeping, a dozen ATen calls for the embedding, the rotations, the final norm), on CPU
caches that each stream had just emptied: measured 4 Dec 2026 on the 2-core AVX-512 EPYC, about
0.6 ms of a 9 ms step, a few microseconds warm per op but 5-10 cold. `wecom_decode_step`
(`inference/layers/kernels/cpu_kernels.c`) does the embedding row, the rotation of the position, every
decoder layer with its cache append and attention (`wecom_layer_decode`, see
`inference/models/cpu_decode.py`) and the final norm; Python only checks that the plans still
hold and says where each layer's row goes in its `LayerCache` (`LayerCache.row_slots`, then
`row_appended` for the node election and the length), once a step.

Taken by `Glm5SparseForCausalLM.forward` (GLM-4's too) for one token of a `KVCache` when every
decoder layer has a plan (`cpu_decode.layer_plan`), the embedding is a plain fp32 `nn.Embedding`,
the final norm an fp32 `RMSNorm`, autograd is off and no module hook is registered on a layer;
anything else runs the layers one by one. The layers' own `forward` does not run here: this is
for layers whose forward is the fused path of `cpu_decode` (`DecoderLayer`, `Glm4DecoderLayer`).
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from inference.layers.caches.gqa_sequence import LayerCache
from inference.layers.kernels import cpu_kernels
from inference.models import cpu_decode


class _ModelStruct(ctypes.Structure):
    """`wecom_model` of cpu_kernels.c, field for field."""

    _fields_ = [
        ("layers", ctypes.c_long), ("layer", ctypes.c_void_p), ("embedding", ctypes.c_void_p),
        ("vocab", ctypes.c_long), ("inv_freq", ctypes.c_void_p), ("rotary_pairs", ctypes.c_long),
        ("norm", ctypes.c_void_p), ("eps", ctypes.c_float),
    ]


class ModelPlan:
    """What `wecom_decode_step` reads of a model: its layers' plans, the embedding, the rotary
    frequencies and the final norm; and what that was made from (to notice changes)."""

    __slots__ = ("watched", "plans", "refs", "struct", "ref", "hidden", "rotary_dim", "tensors", "scratch", "heads")

    def __init__(self, plans: list, tensors: list[torch.Tensor], struct: _ModelStruct, refs) -> None:
        self.plans, self.tensors, self.struct, self.refs = plans, tensors, struct, refs
        self.ref = ctypes.addressof(struct)
        self.hidden, self.rotary_dim = plans[0].hidden, 2 * struct.rotary_pairs
        self.watched: list[tuple] = []
        # `wecom_decode_step`'s scratch is scratch + heads * keys floats for rows attending to keys
        self.heads = max(p.struct.heads for p in plans)
        self.scratch = 2 * self.hidden + self.rotary_dim + max(cpu_decode.row_scratch(p, 0) for p in plans)

    def still_holds(self, layers) -> bool:
        """Whether the model's parts are the ones it was made from and every layer still has the
        same plan (each layer's plan checks its own weights)."""
        if len(layers) != len(self.plans) or not cpu_decode.holds(self.watched):
            return False
        return all(cpu_decode.layer_plan(layer) is p for layer, p in zip(layers, self.plans, strict=True))


def plan(model, layers) -> ModelPlan | None:
    """The plan of `model` (`layers`: its decoder layers), remade when any part of it changed;
    None where the step cannot run."""
    cached = model.__dict__.get("_cpu_step_plan")
    if cached is not None and cached.still_holds(layers):
        return cached
    model.__dict__.pop("_cpu_step_plan", None)
    if not cpu_kernels.available() or len(layers) == 0:
        return None
    made = _make(model, layers)
    if made is not None:
        model.__dict__["_cpu_step_plan"] = made
    return made


def _make(model, layers) -> ModelPlan | None:
    inner, rotary = model.model, model.rotary
    embed, norm = inner.embed_tokens, inner.norm
    plans = [cpu_decode.layer_plan(layer) for layer in layers]
    if any(p is None for p in plans) or type(embed) is not nn.Embedding or embed.max_norm is not None:
        return None
    table, norm_weight, freqs = embed.weight, cpu_decode.norm_weight(norm), rotary.inv_freq
    hidden = plans[0].hidden
    if (
        table.dtype != torch.float32 or table.device.type != "cpu" or not table.is_contiguous()
        or table.dim() != 2 or table.shape[1] != hidden or norm_weight is None or norm_weight.numel() != hidden
        or freqs.dtype != torch.float32 or freqs.device.type != "cpu" or not freqs.is_contiguous() or freqs.dim() != 1
        or any(p.hidden != hidden or 2 * freqs.numel() > p.struct.head_dim for p in plans)
    ):
        return None
    refs = (ctypes.c_void_p * len(plans))(*[p.ref for p in plans])
    struct = _ModelStruct(
        layers=len(plans), layer=ctypes.addressof(refs), embedding=table.data_ptr(), vocab=table.shape[0],
        inv_freq=freqs.data_ptr(), rotary_pairs=freqs.numel(), norm=norm_weight.data_ptr(), eps=norm.eps,
    )
    made = ModelPlan(plans, [table, norm_weight, freqs], struct, refs)
    made.watched = cpu_decode.watch([
        (model, "model"), (inner, "embed_tokens"), (embed, "weight"), (inner, "norm"), (norm, "weight"),
        (model, "rotary"), (rotary, "inv_freq"), (inner, "layers"),
    ])
    return made


def step(model, input_ids: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor | None:
    """The final-normed hidden state `[1, hidden]` of the token `input_ids [1]` at `positions [1]`,
    appended to `cache`; None where this path does not apply (nothing is appended then)."""
    if (
        input_ids.shape != (1,) or positions.shape != (1,) or input_ids.dtype is not torch.int64
        or positions.dtype is not torch.int64 or not input_ids.is_cpu or not positions.is_cpu
        or torch.is_grad_enabled() or nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks
    ):
        return None
    caches, layers = getattr(cache, "layers", None), model.model.layers
    if caches is None or len(caches) < len(layers) or any(type(c) is not LayerCache for c in caches[: len(layers)]):
        return None  # the serving engine's paged cache, a cache of MTP layers only
    made = plan(model, layers)
    if made is None:
        return None
    caches = caches[: len(layers)]
    if any(layer._forward_hooks or layer._forward_pre_hooks for layer in layers):
        return None
    threads = torch.get_num_threads()
    rows = (cpu_decode.KvRowStruct * len(caches))()
    keys = 0
    for i, (p, layer_cache) in enumerate(zip(made.plans, caches, strict=True)):
        p.struct.threads, p.struct.rotary_dim = threads, made.rotary_dim
        placed = cpu_decode.row(layer_cache, p)
        if placed is None:
            return None
        rows[i], row_keys = placed
        keys = max(keys, row_keys)
    scratch = torch.empty(made.scratch + made.heads * keys)
    out = torch.empty(1, made.hidden)
    status = cpu_kernels.library().wecom_decode_step(
        made.ref, ctypes.addressof(rows), input_ids.data_ptr(), positions.data_ptr(), out.data_ptr(),
        scratch.data_ptr())
    if status != 0:  # a token outside the vocabulary: the torch layers raise torch's error
        return None
    for layer_cache in caches:
        layer_cache.row_appended()
    return out
