"""RMSNorm, computed in fp32 like Hugging Face's so that weights and logits are interchangeable."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from inference.layers.linear import weight_key


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self._scaled: tuple[torch.Tensor, torch.Tensor, tuple] | None = None

    def __getstate__(self) -> dict:
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        return {**state, "_scaled": None}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            if torch.is_grad_enabled():
                return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
            # Inference: x * w / sqrt(|x|^2 / d + eps) as 4 kernels, with sqrt(d) folded into the
            # weight: F.rms_norm is composite on CPU (pow, mean, add, rsqrt, two muls and casts,
            # about 9 kernels) and a decode step runs it 9 (demo) to 49 (GLM-4) times; the MTP
            # draft of the demo model 5 times per depth. Same value up to rounding (~1 ulp).
            scaled, floor = self._scaled_weight(x.shape[-1])
            norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
            return x / torch.hypot(norm, floor) * scaled
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)

    def _scaled_weight(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`weight * sqrt(d)` and `sqrt(d * eps)`, remade when the weight changes."""
        w, key = self.weight, weight_key(self.weight)
        if self._scaled is None or self._scaled[2] != key:
            scaled = (w.detach() * math.sqrt(size)).contiguous()
            floor = torch.tensor(math.sqrt(size * self.eps), dtype=w.dtype, device=w.device)
            self._scaled = (scaled, floor, key)
        return self._scaled[0], self._scaled[1]
