"""Decoding constrained to a few whole replies (``SamplingParams.choice``).

An extractive model (the bundled demo: it answers by quoting a passage, or says "not found")
is given its possible replies; at each step it may only continue one of them, so its choice is
its own (greedy or sampled among the allowed tokens) and its quote is exact. Once its tokens so
far fit one reply alone, the rest of that reply and an end-of-sequence token are appended at
once, without a forward per token.

Token-level, on each reply's own tokenization: a model writes a text as its tokenizer encodes
it, which is how it was trained to.
"""

from __future__ import annotations

import torch


class Choices:
    def __init__(self, replies: list[list[int]], eos_token_id: int, bias: list[float] | None = None):
        """``bias``: one number per reply (``SamplingParams.choice_bias``); a reply listed twice
        keeps its first."""
        unique: dict[tuple[int, ...], float] = {}
        for reply, b in zip(replies, bias or [0.0] * len(replies), strict=True):
            if reply:
                unique.setdefault(tuple(reply), float(b))
        if not unique:
            raise ValueError("choice: no reply to choose from")
        self.replies = [[*r, eos_token_id] for r in unique]  # each ends the sequence
        self.bias = list(unique.values())

    def alive(self, written: list[int]) -> list[list[int]]:
        n = len(written)
        return [r for r in self.replies if len(r) > n and r[:n] == written]

    def allowed(self, written: list[int]) -> list[int]:
        """The tokens that continue a reply after ``written`` (never empty while one fits)."""
        n = len(written)
        return sorted({r[n] for r in self.alive(written)})

    def rest(self, written: list[int]) -> list[int]:
        """The tokens that finish the only reply ``written`` still fits, or [] while several do."""
        alive = self.alive(written)
        return alive[0][len(written):] if len(alive) == 1 else []


class AnyBut(tuple):
    """Any token but these (a constraint's free text: ``inference.engine.tool_constraint``)."""


def mask_to_allowed(logits: torch.Tensor, allowed: list[list[int] | AnyBut | None]) -> torch.Tensor:
    """Rows with a list keep only those tokens' logits (the rest -inf), rows with ``AnyBut``
    lose those; None rows are free."""
    rows = [i for i, a in enumerate(allowed) if a is not None]
    if not rows:
        return logits
    keep = torch.zeros(len(rows), logits.shape[-1], dtype=torch.bool, device=logits.device)
    for k, i in enumerate(rows):
        if isinstance(allowed[i], AnyBut):
            keep[k] = True
            keep[k, list(allowed[i])] = False
        else:
            keep[k, allowed[i]] = True
    logits = logits.clone()
    index = torch.tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill(~keep, float("-inf"))
    return logits
