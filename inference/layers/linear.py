"""The one place linear layers are made, and their int8 weight-only (W8A16) replacement."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Linear):
    """A plain dense linear layer (weight `[out, in]`, optional bias), as Hugging Face stores it."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)


class PackedLinear(Linear):
    """Linear layers that share their input, stacked into one matrix: one matmul instead of
    several (a decode step is launch-bound for the small k/v projections). The checkpoint keeps
    each part under its own name, a sibling of this module (`parts`: name -> output rows); the
    loader stacks them in order."""

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool = False) -> None:
        super().__init__(in_features, sum(parts.values()), bias=bias)
        self.parts = dict(parts)


class Int8Linear(nn.Module):
    """W8A16: int8 weights with one scale per output channel, activations stay bf16/fp16/fp32.

    On CPU the matmul is `aten._weight_int8pack_mm` (bf16 activations; measured 1.6x fp32 decode
    on a 134M model, where dequantize-then-`F.linear` was 8x slower than dense). Elsewhere the
    weight is dequantized per call: correct, not fast.
    """

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("weight", weight)  # int8 [out, in]
        self.register_buffer("scales", scales)  # [out], the activations' dtype family (bf16 on CPU)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        weight, scales = quantize_weight(linear.weight.detach())
        device = linear.weight.device
        scales = scales.to(torch.bfloat16 if device.type == "cpu" else linear.weight.dtype)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        module = cls(weight, scales, bias)
        if isinstance(linear, PackedLinear):
            module.parts = dict(linear.parts)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.device.type == "cpu":
            out = torch.ops.aten._weight_int8pack_mm(flat.to(torch.bfloat16), self.weight, self.scales)
        else:
            out = F.linear(flat, self.weight.to(flat.dtype)) * self.scales.to(flat.dtype)
        out = out.to(x.dtype)
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: `weight ~ q * scale[:, None]`, q in [-127, 127]."""
    w = weight.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def quantize_linears_(model: nn.Module) -> nn.Module:
    """Replace every `Linear` of `model` by an `Int8Linear` (in place; returns `model`)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Int8Linear.from_linear(child))
    return model
