"""The one place linear layers are made, so that a quantised (int8 W8A16) kind can replace them."""

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
