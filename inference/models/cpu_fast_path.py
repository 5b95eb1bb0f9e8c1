"""The CPU fast path, put in from outside the model files (as int8 is, by swapping modules).

`install_(model)` swaps each decoder layer of a type listed in `FUSED_LAYERS` for its subclass
whose forward first tries the compiled calls of `cpu_decode` (up to `cpu_decode.MAX_ROWS` fp32
rows: decode, a speculative verify, a small batch) and otherwise runs the model file's own
forward; and, when every decoder layer was swapped, the model for its subclass whose forward
first tries `cpu_step` (one token of one sequence through the whole model in one call). Layers of
any other type, a new architecture's say, are left alone and run their own torch code: the model
files hold no fast-path code, and a newcomer's layer cannot reach kernels written for another's.
The swap keeps every parameter and buffer (only `__class__` changes); the fast path checks per
call what it needs (kernels built, no autograd, fp32 rows on the CPU) and steps aside otherwise,
so installing it on a model that will run on a GPU or train costs a few checks and nothing else.
GLM's MoE (`FUSED_MODULES`) is swapped wherever it sits for `CpuMoE`, whose experts run in one
compiled call a layer (`cpu_moe`).
"""

from __future__ import annotations

import torch
from torch import nn

from inference.layers.kernels import moe_triton
from inference.layers.moe import MoE
from inference.models import cpu_decode, cpu_moe, cpu_step
from inference.models.glm4 import Glm4DecoderLayer, Glm4ForCausalLM
from inference.models.glm5_sparse import DecoderLayer, Glm5SparseForCausalLM


def _fused_layer_forward(self, h: torch.Tensor, rotations: torch.Tensor, cache) -> torch.Tensor:
    plan = cpu_decode.plan(self, h)
    if plan is not None:  # a few fp32 rows on CPU: compiled calls around (or with) the attention
        return cpu_decode.forward(self, plan, h, rotations, cache)
    return super(type(self), self).forward(h, rotations, cache)


def _fused_routed(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    made = None
    if (not torch.is_grad_enabled() and x.dim() == 2 and x.dtype == torch.float32 and x.device.type == "cpu"
            and not moe_triton.wanted(x)):  # (the grouped kernel is wanted on the CPU only interpreted, by tests)
        made = cpu_moe.plan(self)
    if made is None:
        return super(type(self), self).routed(x, weights, experts)
    top_k = experts.shape[1]
    flat = experts.flatten()
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=len(self.experts))
    rows, chosen = x[order // top_k], weights.flatten()[order].float()
    if int(counts.max()) <= cpu_moe.MAX_ROWS:  # decode, verify, small batches: one compiled call
        done = cpu_moe.run(made, counts, rows, chosen)
    else:
        done = cpu_moe.by_torch(self, counts.tolist(), rows, chosen)
    pairs = torch.empty_like(done)
    pairs[order] = done
    return pairs.view(x.shape[0], top_k, -1).sum(dim=1)


def _fused_model_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
    out = cpu_step.step(self, input_ids, positions, cache)
    if out is not None:  # one fp32 token on CPU: the whole model in one compiled call
        return out
    return super(type(self), self).forward(input_ids, positions, cache)


class CpuDecoderLayer(DecoderLayer):
    forward = _fused_layer_forward


class CpuGlm4DecoderLayer(Glm4DecoderLayer):
    forward = _fused_layer_forward  # the sandwich norms are in the kernels' layer too


class CpuMoE(MoE):
    routed = _fused_routed  # every expert of the layer in one compiled call (`cpu_moe`)


class CpuGlm5SparseForCausalLM(Glm5SparseForCausalLM):
    forward = _fused_model_forward


class CpuGlm4ForCausalLM(Glm4ForCausalLM):
    forward = _fused_model_forward


# Exact types only: a subclass may change what its forward computes.
FUSED_LAYERS: dict[type, type] = {DecoderLayer: CpuDecoderLayer, Glm4DecoderLayer: CpuGlm4DecoderLayer}
FUSED_MODULES: dict[type, type] = {MoE: CpuMoE}  # parts of layers, whatever layer holds them
FUSED_MODELS: dict[type, type] = {Glm5SparseForCausalLM: CpuGlm5SparseForCausalLM, Glm4ForCausalLM: CpuGlm4ForCausalLM}


def install_(model: nn.Module) -> nn.Module:
    """Swap the known layer types of `model` (MTP blocks included) and, where every decoder
    layer is one of them, the model itself for their fast-path versions; returns `model`."""
    for module in model.modules():
        fused = FUSED_LAYERS.get(type(module))
        if fused is not None:
            module.__class__ = fused
        fused = FUSED_MODULES.get(type(module))
        if fused is not None:
            module.__class__ = fused
            if fused is CpuMoE:
                cpu_moe.prepare_(module)
    layers = getattr(getattr(model, "model", None), "layers", None)
    fused_model = FUSED_MODELS.get(type(model))
    if fused_model is not None and layers is not None and all(type(layer) in FUSED_LAYERS.values() for layer in layers):
        model.__class__ = fused_model
    return model
