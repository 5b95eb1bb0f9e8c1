"""GLM partial rotary embedding.

Only the first `rotary_dim` channels of each head rotate; the rest pass through. GLM-4 rotates
interleaved pairs (channels 2i and 2i+1 form one complex number turned by
`position * theta**(-2i/rotary_dim)`), transformers' Glm4 `apply_rotary_pos_emb`; GLM-4.5 (glm4_moe)
rotates halves (channels i and i + rotary_dim/2, its `rotate_half`), the same angles. Each model
type's own convention, so checkpoints load without permuting q/k weights. The pairs are rotated as one
complex multiply, in place: a decode step runs this for every layer, and a handful of ops instead
of the ~15 of the cos/sin form is measurable there.

YaRN (DeepSeek-V3's long-context rope, `rope_type` "yarn"): interpolated frequencies for the
slow channels, and cos/sin scaled by an attention factor, which a complex rotation carries as its
magnitude (`RotaryEmbedding.magnitude`); transformers' `_compute_yarn_parameters`.
"""

import math

import torch


class RotaryEmbedding:
    def __init__(self, rotary_dim: int, theta: float, yarn: dict | None = None,
                 max_position_embeddings: int | None = None) -> None:
        """`yarn`: a config's YaRN parameters (`rope_parameters` of rope_type "yarn")."""
        self.rotary_dim = rotary_dim
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # (inv_freq, [magnitude])
        self.magnitude = 1.0
        if yarn is None:
            self.inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float, device="cpu") / rotary_dim))
        else:
            self.inv_freq, self.magnitude = yarn_frequencies(rotary_dim, theta, yarn, max_position_embeddings)

    @property
    def inv_freq(self) -> torch.Tensor:
        return self._inv_freq

    @inv_freq.setter
    def inv_freq(self, value: torch.Tensor) -> None:
        """A new table (a scaled rope) drops the copies made of the old one on each device."""
        self._inv_freq = value
        self._on.clear()

    def rotations(self, positions: torch.Tensor) -> torch.Tensor:
        """Complex numbers `[L, rotary_dim / 2]` of modulus `magnitude` (1 unless YaRN; complex64,
        angles computed in fp32).
        Two kernels (every forward and every MTP draft depth calls this): `outer` promotes the
        integer positions to fp32 itself, and `polar` broadcasts a cached one."""
        on = self._on.get(positions.device)
        if on is None:
            with torch.inference_mode(False):  # plain tensors: training calls this too
                on = self._on[positions.device] = (
                    self.inv_freq.to(positions.device),
                    torch.full((1,), self.magnitude, device=positions.device),
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


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_frequencies(rotary_dim: int, theta: float, params: dict,
                     max_position_embeddings: int | None) -> tuple[torch.Tensor, float]:
    """YaRN's `(inv_freq [rotary_dim / 2], attention factor)`: channels that turn fewer than
    `beta_slow` times over the original context are interpolated by `factor`, those that turn
    more than `beta_fast` times kept, a linear ramp between."""
    original = params.get("original_max_position_embeddings") or max_position_embeddings
    factor = params.get("factor") or max_position_embeddings / original
    attention = params.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention = yarn_mscale(factor)
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def channel(rotations: float) -> float:  # the channel that turns `rotations` times
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = channel(beta_fast), channel(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    turns = theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device="cpu") / rotary_dim)
    extrapolation, interpolation = 1.0 / turns, 1.0 / (factor * turns)
    kept = 1 - ramp  # how much of each channel keeps its own frequency
    return interpolation * (1 - kept) + extrapolation * kept, float(attention)
