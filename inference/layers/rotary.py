"""GLM partial rotary embedding.

Only the first `rotary_dim` channels of each head rotate; they rotate as interleaved pairs
(channels 2i and 2i+1 form one complex number turned by `position * theta**(-2i/rotary_dim)`),
the rest pass through. This is the convention of transformers' Glm4 `apply_rotary_pos_emb`, so
checkpoints move between the two without permuting q/k weights. The pairs are rotated as one
complex multiply, in place: a decode step runs this for every layer, and a handful of ops instead
of the ~15 of the cos/sin form is measurable there.
"""

import torch


class RotaryEmbedding:
    def __init__(self, rotary_dim: int, theta: float) -> None:
        self.rotary_dim = rotary_dim
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float, device="cpu") / rotary_dim))

    def rotations(self, positions: torch.Tensor) -> torch.Tensor:
        """Unit complex numbers `[L, rotary_dim / 2]` (complex64, angles computed in fp32)."""
        angles = positions.float()[:, None] * self.inv_freq.to(positions.device)[None]
        return torch.polar(torch.ones_like(angles), angles)


def apply_rotary_(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Rotate `x [L, heads, head_dim]` in place by `rotations [L, rotary_dim / 2]`; returns `x`."""
    rot = x[..., : rotations.shape[-1] * 2]
    pairs = torch.view_as_complex(rot.float().unflatten(-1, (-1, 2)))
    rot.copy_(torch.view_as_real(pairs * rotations[:, None]).flatten(-2))
    return x
