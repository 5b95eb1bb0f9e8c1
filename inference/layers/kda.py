"""Kimi Delta Attention (KDA), the linear attention of three in four GLM-5.3-Flash (`glm5_next`)
layers, as transformers 5.24's `Glm5NextTextLinearAttention` computes it.

Per token: q, k, v (`linear_num_heads` heads of `linear_head_dim`) through a causal depthwise
convolution of `linear_conv_kernel_dim` taps over the last positions and a SiLU; q and k
L2-normalised, q scaled by `head_dim ** -0.5`; a forget gate per key channel,
`g = lower_bound * sigmoid(exp(A_log) * (f_b(f_a(x)) + dt_bias))` (log-decay in
(lower_bound, 0)), and a write strength `beta = sigmoid(b_proj(x))` per head. Each head keeps a
state `S [head_dim (keys), head_dim (values)]`, the gated delta rule:

    S <- diag(exp(g_t)) S;   S <- S + beta_t k_t (v_t - S^T k_t)^T;   o_t = S^T q_t

then `o_norm` (an RMSNorm over each head, times sigmoid(g_b(g_a(x)))) and `o_proj`. The state
and the convolution's last `kernel - 1` inputs are all a sequence keeps: a decode step costs the
same at any context length (`KDAState`, per sequence and layer, fp32).

Prefill runs the chunked (chunk-parallel) form, `CHUNK` positions at a time: within a chunk the
delta rule's corrections are one triangular solve, across chunks the state carries (FLA's
`chunk_kda`, transformers' torch reference of it); a single new position runs the recurrent step.
Both are the same recurrence summed in another order. The decay between two positions of a
chunk is the difference of two running sums of the gates (down to -100 and below after 64
positions with gates down to -5); summed in fp32 as the reference does, their rounding stayed in
every difference. Here they are summed in float64 and kept as two fp32 parts (`running_sums`),
whose differences are as exact as fp32 gets. Against a float64 recurrence (4 heads of 8, 70
positions, 3 seeds) the chunked form's outputs and state are 8e-8 off with the bounded gate and
2e-7 with the softplus one (1.4e-6 and 1.0e-6 before), the fp32 recurrent step 6e-8
(tests/inference/test_glm5_next_kda.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inference.config import ModelConfig
from inference.layers.linear import Linear, PackedLinear

CHUNK = 64  # positions a chunk of the prefill form (transformers' and FLA's default)
L2_EPS = 1e-6


class KDAState:
    """One sequence's state in one KDA layer: the convolution's last inputs `[3 * heads * dim,
    kernel - 1]` and the delta rule's `[heads, dim, dim]`, both fp32, zeros before the first
    position."""

    def __init__(self, channels: int, taps: int, heads: int, dim: int, device: torch.device) -> None:
        self.conv = torch.zeros(channels, taps - 1, device=device)
        self.recurrent = torch.zeros(heads, dim, dim, device=device)
        self.length = 0

    def nbytes(self) -> int:
        return (self.conv.numel() + self.recurrent.numel()) * 4

    def reset(self) -> None:
        self.conv.zero_()
        self.recurrent.zero_()
        self.length = 0


def state_bytes(config: ModelConfig) -> int:
    """Bytes of one sequence's `KDAState` in one layer."""
    heads, dim, taps = config.linear_num_heads, config.linear_head_dim, config.linear_conv_kernel_dim
    return (3 * heads * dim * (taps - 1) + heads * dim * dim) * 4


class _Weight(nn.Module):
    """A bare weight under a checkpoint name of its own (`self_attn.q_conv1d.weight`)."""

    def __init__(self, *shape: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(*shape))


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """FLA's (and transformers') L2 normalisation: `x / sqrt(sum x^2 + eps)`."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def recurrent_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   state: torch.Tensor) -> torch.Tensor:
    """One position for a batch of states: `q, k, g [B, H, D]` (q scaled), `v [B, H, Dv]`,
    `beta [B, H]`, `state [B, H, D, Dv]` (updated in place); returns `o [B, H, Dv]`."""
    state.mul_(g.exp()[..., None])
    memory = (state * k[..., None]).sum(dim=-2)
    delta = (v - memory) * beta[..., None]
    state.add_(k[..., None] * delta[..., None, :])
    return (state * q[..., None]).sum(dim=-2)


def running_sums(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The running sums of a chunk's gates `g [H, n, D]` along the positions, summed in float64
    and returned as two fp32 parts, `hi + lo`: the difference of two of them, taken part by part,
    keeps no rounding of the sums (a float64 difference would cost a float64 `[H, n, n, D]`)."""
    exact = g.double().cumsum(dim=1)
    hi = exact.float()
    return hi, (exact - hi.double()).float()


def chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            state: torch.Tensor) -> torch.Tensor:
    """The chunked form over one sequence's positions: `q, k, g [H, T, D]` (q scaled), `v [H, T,
    Dv]`, `beta [H, T]`, the state before them `[H, D, Dv]` (updated in place to the state after
    them); returns `o [H, T, Dv]`."""
    heads, length, dim = k.shape
    out = v.new_empty(heads, length, v.shape[-1])
    for a in range(0, length, CHUNK):
        b = min(a + CHUNK, length)
        n = b - a
        qc, kc, vc, bc = q[:, a:b], k[:, a:b], v[:, a:b], beta[:, a:b, None]
        gc, low = running_sums(g[:, a:b])  # [H, n, D]
        k_beta, v_beta = kc * bc, vc * bc
        # the decay from j to i for j <= i (later j masked to exp(-inf) = 0)
        between = gc[:, :, None] - gc[:, None]
        between += low[:, :, None] - low[:, None]
        later = torch.triu(torch.ones(n, n, dtype=torch.bool, device=q.device), diagonal=1)
        decay = between.masked_fill_(later[None, :, :, None], float("-inf")).exp_()
        # the delta rule's corrections within the chunk: (I - A)^-1, A strictly lower
        not_below = torch.triu(torch.ones(n, n, dtype=torch.bool, device=q.device))
        lower = -(k_beta[:, :, None] * kc[:, None] * decay).sum(dim=-1).masked_fill(not_below, 0)
        system = torch.eye(n, device=q.device) - lower
        solved = torch.linalg.solve_triangular(system, torch.cat((v_beta, k_beta * gc.exp()), dim=-1),
                                               upper=False, unitriangular=True)
        values, k_cumdecay = solved[..., : vc.shape[-1]], solved[..., vc.shape[-1] :]
        inter = (qc * gc.exp()) @ state
        intra = (qc[:, :, None] * kc[:, None] * decay).sum(dim=-1)  # diagonal kept, later ones exp(-inf) = 0
        fresh = values - k_cumdecay @ state
        out[:, a:b] = inter + intra @ fresh
        to_end = ((gc[:, -1:] - gc) + (low[:, -1:] - low)).exp()  # [H, n, D]: to the chunk's last position
        state.mul_(gc[:, -1:].transpose(1, 2).exp()).add_((kc * to_end).transpose(1, 2) @ fresh)
    return out


class KDAttention(nn.Module):
    """One KDA layer; its checkpoint names are `self_attn.*` as the published GLM-5.3-Flash
    stores them (`q_proj`, `q_conv1d`, `f_a_proj`, `dt_bias`, `A_log`, `b_proj`, `g_a_proj`,
    `o_norm`, ...)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, heads, dim = config.hidden_size, config.linear_num_heads, config.linear_head_dim
        self.heads, self.dim, self.taps = heads, dim, config.linear_conv_kernel_dim
        width = heads * dim
        self.qkv_proj = PackedLinear(hidden, {"q_proj": width, "k_proj": width, "v_proj": width})
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (_Weight(width, 1, self.taps) for _ in range(3))
        self.f_a_proj = Linear(hidden, dim)
        self.f_b_proj = Linear(dim, width)
        self.dt_bias = nn.Parameter(torch.empty(width))
        self.A_log = nn.Parameter(torch.empty(heads))
        self.lower_bound = config.linear_lower_bound
        self.b_proj = Linear(hidden, heads)
        self.g_a_proj = Linear(hidden, dim)
        self.g_b_proj = Linear(dim, width)
        self.o_norm = _Weight(dim)
        self.eps = config.rms_norm_eps
        self.o_proj = Linear(width, hidden)

    def new_state(self, device: torch.device) -> KDAState:
        return KDAState(3 * self.heads * self.dim, self.taps, self.heads, self.dim, device)

    def forward(self, x: torch.Tensor, states: list[KDAState], lengths: list[int]) -> torch.Tensor:
        """`x [T, hidden]`, the normed rows of one or more sequences one after another
        (`lengths` rows each), `states` theirs (advanced in place)."""
        mixed = self.qkv_proj(x).float()  # [T, 3 * width]
        conv = torch.cat((self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight))[:, 0].float()
        gate = self.gate(x)  # [T, H, D]
        beta = torch.sigmoid(self.b_proj(x).float())  # [T, H]
        width = self.heads * self.dim
        outs, a = [], 0
        single = all(n == 1 for n in lengths) and len(lengths) > 1
        if single:  # decode rows of several sequences: one batched recurrent step
            convolved = torch.stack([self._convolve(mixed[i : i + 1], conv, s) for i, s in enumerate(states)])[:, 0]
            q, k, v = (convolved[:, i * width : (i + 1) * width].view(-1, self.heads, self.dim) for i in range(3))
            q, k = l2norm(q) * self.dim**-0.5, l2norm(k)
            stacked = torch.stack([s.recurrent for s in states])
            out = recurrent_step(q, k, v, gate, beta, stacked)
            for s, new in zip(states, stacked, strict=True):
                s.recurrent.copy_(new)
                s.length += 1
        else:
            for state, n in zip(states, lengths, strict=True):
                convolved = self._convolve(mixed[a : a + n], conv, state)
                q, k, v = (convolved[:, i * width : (i + 1) * width].view(n, self.heads, self.dim) for i in range(3))
                q, k = l2norm(q) * self.dim**-0.5, l2norm(k)
                if n == 1:
                    o = recurrent_step(q, k, v, gate[a : a + 1], beta[a : a + 1], state.recurrent[None])
                else:
                    o = chunked(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                gate[a : a + n].transpose(0, 1), beta[a : a + n].t(), state.recurrent).transpose(0, 1)
                outs.append(o)
                state.length += n
                a += n
            out = outs[0] if len(outs) == 1 else torch.cat(outs)
        out = self._gated_norm(out, x)
        return self.o_proj(out.reshape(x.shape[0], width).to(x.dtype))

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        """The forget gate's log-decay per key channel, `[T, H, D]` fp32."""
        g = (self.f_b_proj(self.f_a_proj(x)).float() + self.dt_bias.float()).view(x.shape[0], self.heads, self.dim)
        rate = self.A_log.float().exp()[None, :, None]
        if self.lower_bound is not None:
            return self.lower_bound * torch.sigmoid(rate * g)
        return -rate * torch.where(g > 20.0, g, torch.log1p(g.exp()))

    def _convolve(self, rows: torch.Tensor, weight: torch.Tensor, state: KDAState) -> torch.Tensor:
        """The causal depthwise convolution of `rows [n, C]` after the state's last inputs, and
        SiLU; the state keeps the newest `taps - 1` inputs."""
        joined = torch.cat((state.conv, rows.t()), dim=1)  # [C, taps - 1 + n]
        state.conv.copy_(joined[:, joined.shape[1] - state.conv.shape[1] :])
        # the depthwise convolution as windows times taps: the library's grouped conv1d took
        # 4.6 ms for one decode row of 1536 channels here, this a few microseconds
        out = (joined.unfold(1, weight.shape[1], 1) * weight[:, None]).sum(dim=-1)  # [C, n]
        return F.silu(out).t()

    def _gated_norm(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`o_norm`: an RMSNorm over each head's values times sigmoid(g_b(g_a(x)))."""
        gate = self.g_b_proj(self.g_a_proj(x)).float().view(x.shape[0], self.heads, self.dim)
        normed = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps) * self.o_norm.weight.float()
        return normed * torch.sigmoid(gate)
