"""The one place linear layers are made, so that a quantised (int8 W8A16) kind can replace them."""

from torch import nn


class Linear(nn.Linear):
    """A plain dense linear layer (weight `[out, in]`, optional bias), as Hugging Face stores it."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
