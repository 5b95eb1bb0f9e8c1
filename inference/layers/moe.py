"""GLM's Mixture of Experts (GLM-4.5 and later; DeepSeek-V3's design): a sigmoid router with a
load-balancing bias, routed SwiGLU experts and always-on shared experts.

Routing (transformers' `Glm4MoeTopkRouter`, in fp32 as its checkpoints keep the router): scores
are `sigmoid(x @ gate.weight.T)`; experts are chosen by `score + e_score_correction_bias` (the
bias only steers the choice), first among the `topk_group` best of `n_group` groups (a group's
merit is the sum of its two best biased scores), then the `num_experts_per_tok` best; a chosen
expert's weight is its unbiased score, normalised over the chosen when `norm_topk_prob`, times
`routed_scaling_factor`.

Experts run on tokens grouped by expert: the (token, expert) pairs of a batch are sorted by
expert once, each expert that was chosen takes its contiguous run of rows in one call, and the
weighted results go back to their (token, k) places and are summed over k. The Python loop is over experts
(at most `n_routed_experts` a layer, the chosen ones doing work), never over tokens. Each expert
is an ordinary `SwiGLU` of `Linear` layers, so the loader stacks its gate/up parts and int8
(W8A16) quantization swaps its layers as it does every other. On CUDA, plain experts run in two
grouped launches instead of the loop (inference/layers/kernels/moe_triton.py).
"""

from __future__ import annotations

import torch
from torch import nn

from inference.config import ModelConfig
from inference.layers.activation import silu_and_mul
from inference.layers.kernels import moe_triton
from inference.layers.linear import Linear, PackedLinear


class SwiGLU(nn.Module):
    """`down(silu(gate(x)) * up(x))`, stored as Hugging Face's `gate_proj`/`up_proj`/`down_proj`
    (gate and up stacked in memory into one `gate_up_proj`)."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = PackedLinear(hidden, {"gate_proj": intermediate, "up_proj": intermediate})
        self.down_proj = Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class TopkRouter(nn.Module):
    """Chooses each token's experts and their weights (see the module docstring). Its weight and
    bias stay fp32 whatever the model's dtype (`FP32_SUFFIXES`), as transformers keeps them."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        experts = config.n_routed_experts
        self.weight = nn.Parameter(torch.empty(experts, config.hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(experts), requires_grad=False)
        self.top_k, self.n_group, self.topk_group = config.num_experts_per_tok, config.n_group, config.topk_group
        self.norm_topk_prob, self.scaling = config.norm_topk_prob, config.routed_scaling_factor

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`x [T, hidden]` -> (weights `[T, top_k]` fp32, experts `[T, top_k]` int64)."""
        scores = torch.sigmoid(x.float() @ self.weight.float().t())
        choice = scores + self.e_score_correction_bias.float()
        if self.topk_group < self.n_group:
            groups = choice.view(x.shape[0], self.n_group, -1)
            merit = groups.topk(2, dim=-1).values.sum(dim=-1)
            kept = torch.zeros_like(merit, dtype=torch.bool)
            kept.scatter_(1, merit.topk(self.topk_group, dim=-1).indices, True)
            choice = groups.masked_fill(~kept[..., None], float("-inf")).view(x.shape[0], -1)
        experts = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, experts)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scaling, experts


class MoE(nn.Module):
    """Routed experts plus shared experts; `gate`, `experts.N` and `shared_experts` are the
    checkpoint's names."""

    # parameters kept in fp32 when the model is loaded in bf16/fp16 (transformers' list for GLM)
    FP32_SUFFIXES = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, size = config.hidden_size, config.moe_intermediate_size
        self.gate = TopkRouter(config)
        self.experts = nn.ModuleList(SwiGLU(hidden, size) for _ in range(config.n_routed_experts))
        self.shared_experts = SwiGLU(hidden, size * config.n_shared_experts) if config.n_shared_experts else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.gate(x)
        out = self.routed(x, weights, experts)
        return out if self.shared_experts is None else out + self.shared_experts(x)

    def routed(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """Sum over each token's chosen experts of weight * expert(token), grouped by expert."""
        stacked = self._stacked_weights(x)
        if stacked is not None:  # CUDA: two grouped launches (inference/layers/kernels/moe_triton.py)
            return moe_triton.routed(x, weights, experts, *stacked)
        top_k = experts.shape[1]
        flat = experts.flatten()
        order = flat.argsort(stable=True)  # (token, expert) pairs grouped by expert
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()  # one host sync a layer
        tokens = order // top_k
        rows = x[tokens]
        done = torch.empty_like(rows)
        start = 0
        for expert, count in enumerate(counts):
            if count:
                done[start : start + count] = self.experts[expert](rows[start : start + count])
                start += count
        done *= weights.flatten()[order, None].to(done.dtype)
        # back to (token, k) order and summed over k: `index_add_` took ~40x longer on CPU here
        pairs = torch.empty_like(done)
        pairs[order] = done
        return pairs.view(x.shape[0], top_k, -1).sum(dim=1)

    def _stacked_weights(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The experts' `gate_up [E, 2I, H]` and `down [E, H, I]` for the grouped kernel, stacked
        on first use (each expert's weights then become views of the stacks: held once); None
        where the kernel is not taken (off CUDA, int8 experts)."""
        if not moe_triton.wanted(x):
            return None
        stacked = getattr(self, "_stacks", None)
        if stacked is not None and stacked[0].device == x.device:
            return stacked
        experts = list(self.experts)
        if not all(type(e.gate_up_proj) is PackedLinear and type(e.down_proj) is Linear
                   and e.gate_up_proj.bias is None and e.down_proj.bias is None for e in experts):
            return None
        gate_up = torch.stack([e.gate_up_proj.weight.detach() for e in experts])
        down = torch.stack([e.down_proj.weight.detach() for e in experts])
        for i, expert in enumerate(experts):
            expert.gate_up_proj.weight = nn.Parameter(gate_up[i], requires_grad=False)
            expert.down_proj.weight = nn.Parameter(down[i], requires_grad=False)
        self._stacks = (gate_up, down)
        return self._stacks
