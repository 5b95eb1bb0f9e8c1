"""GLM partial rotary embedding.

Only the first `rotary_dim` channels of each head rotate; they rotate as interleaved pairs
(channels 2i and 2i+1 form one complex number turned by `position * theta**(-2i/rotary_dim)`),
the rest pass through. This is the convention of transformers' Glm4 `apply_rotary_pos_emb`, so
checkpoints move between the two without permuting q/k weights.
"""

import torch


class RotaryEmbedding:
    def __init__(self, rotary_dim: int, theta: float) -> None:
        self.rotary_dim = rotary_dim
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float, device="cpu") / rotary_dim))

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin, `[L, rotary_dim / 2]`, computed in fp32 then cast like transformers does."""
        freqs = positions.float()[:, None] * self.inv_freq.to(positions.device)[None]
        return freqs.cos().to(dtype), freqs.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` `[L, heads, head_dim]` by the `[L, rotary_dim / 2]` angles."""
    rotary_dim = cos.shape[-1] * 2
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    even, odd = rot[..., 0::2], rot[..., 1::2]
    c, s = cos[:, None], sin[:, None]
    rotated = torch.stack((even * c - odd * s, odd * c + even * s), dim=-1).flatten(-2)
    return torch.cat((rotated, rest), dim=-1)
