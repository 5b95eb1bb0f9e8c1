"""GLM partial rotary embedding.

Only the first `rotary_dim` channels of each head rotate; the rest pass through. GLM-4 rotates
interleaved pairs (channels 2i and 2i+1 form one complex number turned by
`position * theta**(-2i/rotary_dim)`), transformers' Glm4 `apply_rotary_pos_emb`; GLM-4.5 (glm4_moe)
rotates halves (channels i and i + rotary_dim/2, its `rotate_half`), the same angles. Each model
type's own convention, so checkpoints load without permuting q/k weights. The pairs are rotated as one
complex multiply, in place: a decode step runs this for every layer, and a handful of ops instead
of the ~15 of the cos/sin form is measurable there.
"""

import torch


class RotaryEmbedding:
    def __init__(self, rotary_dim: int, theta: float) -> None:
        self.rotary_dim = rotary_dim
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # (inv_freq, [1.0])
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float, device="cpu") / rotary_dim))

    @property
    def inv_freq(self) -> torch.Tensor:
        return self._inv_freq

    @inv_freq.setter
    def inv_freq(self, value: torch.Tensor) -> None:
        """A new table (a scaled rope) drops the copies made of the old one on each device."""
        self._inv_freq = value
        self._on.clear()

    def rotations(self, positions: torch.Tensor) -> torch.Tensor:
        """Unit complex numbers `[L, rotary_dim / 2]` (complex64, angles computed in fp32).
        Two kernels (every forward and every MTP draft depth calls this): `outer` promotes the
        integer positions to fp32 itself, and `polar` broadcasts a cached one."""
        on = self._on.get(positions.device)
        if on is None:
            with torch.inference_mode(False):  # plain tensors: training calls this too
                on = self._on[positions.device] = (
                    self.inv_freq.to(positions.device),
                    torch.ones(1, device=positions.device),
                )
        return torch.polar(on[1], torch.outer(positions, on[0]))


def apply_rotary_(x: torch.Tensor, rotations: torch.Tensor, interleaved: bool = True) -> torch.Tensor:
    """Rotate `x [L, heads, head_dim]` in place by `rotations [L, rotary_dim / 2]`, as pairs
    (`interleaved`) or halves; returns `x`."""
    half = rotations.shape[-1]
    rot = x[..., : half * 2]
    if not interleaved:
        first, second = rot[..., :half], rot[..., half:]
        turned = torch.complex(first.float(), second.float()) * rotations[:, None]
        first.copy_(turned.real)
        second.copy_(turned.imag)
        return x
    pairs = torch.view_as_complex((rot if rot.dtype == torch.float32 else rot.float()).unflatten(-1, (-1, 2)))
    rot.copy_(torch.view_as_real(pairs * rotations[:, None]).flatten(-2))
    return x
