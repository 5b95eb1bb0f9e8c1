"""Turn a batch of logits into next tokens, each row with its own SamplingParams."""

import torch
from torch import Tensor, nn

from inference.sampling_params import SamplingParams


def generator_for(params: SamplingParams, device: torch.device | str) -> torch.Generator | None:
    """A request's private RNG, so a seeded request replays the same tokens in any batch."""
    if params.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(params.seed)


class Sampler(nn.Module):
    """Repetition penalty, temperature, top-k, top-p, then a draw.

    ``probs`` is kept exact and separate from the draw because MTP rejection
    sampling needs the very distribution the tokens were drawn from.
    """

    def forward(
        self,
        logits: Tensor,
        params: list[SamplingParams],
        history: list[list[int]],
        generators: list[torch.Generator | None] | None = None,
    ) -> Tensor:
        probs = self.probs(logits, params, history)
        tokens = probs.argmax(dim=-1)  # greedy rows are one-hot: this is their argmax
        sampled = [i for i, p in enumerate(params) if not p.is_greedy]
        gens = generators or [None] * len(params)
        shared = [i for i in sampled if gens[i] is None]
        if shared:
            tokens[shared] = torch.multinomial(probs[shared], 1).squeeze(-1)
        for i in sampled:
            if gens[i] is not None:
                tokens[i] = torch.multinomial(probs[i], 1, generator=gens[i]).squeeze(-1)
        return tokens

    def probs(
        self, logits: Tensor, params: list[SamplingParams], history: list[list[int]]
    ) -> Tensor:
        """The processed next-token distribution per row, float32 [B, V]."""
        logits = apply_repetition_penalty(logits.float(), params, history)
        temperature = column([1.0 if p.is_greedy else p.temperature for p in params], logits)
        logits = apply_top_k(logits / temperature, [p.top_k for p in params])
        probs = apply_top_p(logits.softmax(dim=-1), [p.top_p for p in params])
        if any(p.is_greedy for p in params):  # decided on the host: no device sync
            greedy = torch.tensor([p.is_greedy for p in params], device=logits.device)
            one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
            probs = torch.where(greedy[:, None], one_hot, probs)
        return probs


def column(values: list[float], like: Tensor) -> Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device)[:, None]


def apply_repetition_penalty(
    logits: Tensor, params: list[SamplingParams], history: list[list[int]]
) -> Tensor:
    """CTRL convention: seen tokens move toward zero-probability whatever their sign."""
    rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0 and history[i]]
    if not rows:
        return logits
    seen = torch.zeros_like(logits, dtype=torch.bool)
    for i in rows:  # ragged histories: one scatter per row
        seen[i, torch.tensor(history[i], device=logits.device)] = True
    penalty = column([p.repetition_penalty for p in params], logits)
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def apply_top_k(logits: Tensor, top_k: list[int]) -> Tensor:
    """Keep each row's k largest logits (ties with the k-th survive, as in HF)."""
    vocab = logits.shape[-1]
    if all(t == 0 or t >= vocab for t in top_k):
        return logits
    k = [t if 0 < t < vocab else 1 for t in top_k]  # rows with top-k off: any k, masked below
    top = logits.topk(max(k), dim=-1).values  # topk, not a full sort of a 150k vocabulary
    kth = top.gather(1, torch.tensor(k, device=logits.device)[:, None] - 1)
    off = torch.tensor([not 0 < t < vocab for t in top_k], device=logits.device)
    kth = kth.masked_fill(off[:, None], float("-inf"))
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(probs: Tensor, top_p: list[float]) -> Tensor:
    """Keep each row's smallest most-likely set whose mass reaches p, renormalised."""
    if all(p >= 1.0 for p in top_p):
        return probs
    p = column(top_p, probs)
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    # The top token has mass_before == 0 < p, so every row keeps at least one token.
    drop_sorted = (mass_before >= p) & (p < 1.0)
    drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
    probs = probs.masked_fill(drop, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)
