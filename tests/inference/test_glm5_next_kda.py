"""KDA's chunked prefill form (inference/layers/kda.py) against the delta rule's recurrence in
float64: as close as the fp32 recurrent step gets, with both of glm5_next's forget gates."""

import pytest
import torch
import torch.nn.functional as F

from inference.layers.kda import CHUNK, chunked, l2norm, recurrent_step


def inputs(heads: int, length: int, dim: int, bound: float | None, seed: int) -> tuple[torch.Tensor, ...]:
    """q (scaled), k, v, the log-decays g and beta as KDAttention makes them: the bounded gate
    `bound * sigmoid(.)` or the softplus one."""
    gen = torch.Generator().manual_seed(seed)
    draw = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    q, k, v = l2norm(draw(heads, length, dim)) * dim**-0.5, l2norm(draw(heads, length, dim)), draw(heads, length, dim)
    x = 2 * draw(heads, length, dim)
    g = bound * torch.sigmoid(x) if bound is not None else -F.softplus(x)
    return q, k, v, g, torch.sigmoid(draw(heads, length)), 0.1 * draw(heads, dim, dim)


def recurrence(q, k, v, g, beta, state) -> torch.Tensor:
    """One position at a time (`state` advanced in place); `o [H, T, Dv]`."""
    steps = [recurrent_step(q[None, :, t], k[None, :, t], v[None, :, t], g[None, :, t], beta[None, :, t], state[None])
             for t in range(q.shape[1])]
    return torch.cat(steps).transpose(0, 1)


@pytest.mark.parametrize("bound", [-5.0, None], ids=["bounded-gate", "softplus-gate"])
def test_the_chunked_form_is_as_close_to_float64_as_the_recurrence(bound):
    """70 positions, a chunk of 64 and a partial one, from a non-zero state. With the running
    sums of the gates (-100 and below after 64 positions) summed in fp32, their differences, the
    decays, kept their rounding: 1.4e-6 (bounded) and 1.0e-6 (softplus) off, where the chunked
    form is now 8e-8 and 2e-7 and the fp32 recurrence 6e-8."""
    length = CHUNK + 6
    for seed in range(3):
        q, k, v, g, beta, state = inputs(4, length, 8, bound, seed)
        exact_state = state.double()
        exact = recurrence(q.double(), k.double(), v.double(), g.double(), beta.double(), exact_state)
        stepped_state, chunked_state = state.clone(), state.clone()
        stepped = recurrence(q, k, v, g, beta, stepped_state)
        out = chunked(q, k, v, g, beta, chunked_state)
        floor = max((stepped.double() - exact).abs().max(), (stepped_state.double() - exact_state).abs().max())
        error = max((out.double() - exact).abs().max(), (chunked_state.double() - exact_state).abs().max())
        assert error <= max(4 * floor, 3e-7), (seed, float(error), float(floor))
