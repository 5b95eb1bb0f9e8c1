"""Choosing among whole replies by likelihood (``SamplingParams.choice_scoring="likelihood"``).

Token-by-token constrained decoding (``inference.engine.choices``) commits to a reply on its
first tokens: a passage that starts like the question wins even when another one, read to its
end, fits it better. Here every reply is read whole instead, as lm-evaluation-harness scores a
multiple-choice answer: its score is the mean log-probability of its tokens (and the
end-of-sequence token after them) given the prompt, so long and short replies compare fairly.

How it runs in the serving engine, batched like any other request:
1. the request's prompt is prefilled alone, as a parent sequence that samples nothing; its last
   row gives every reply's first token, and its full blocks enter the prefix cache;
2. then one child sequence per reply, prompt + reply + EOS, is prefilled (from the cached prompt
   blocks, so each computes little more than its reply); its rows give the log-probability of
   each next reply token;
3. when every child is done, the request's completion is the best reply (greedy), or one drawn
   from the softmax of the scores over the temperature; ``SamplingParams.choice_bias`` is added
   to the scores first (a prior per reply, in the same units).
"""

from __future__ import annotations

import torch

from inference.engine.sequence import Sequence

MODES = ("tokens", "likelihood")


class ChoiceScoring:
    """The scoring state one request's parent and child sequences share."""

    def __init__(self, parent: Sequence, replies: list[list[int]], bias: list[float] | None = None) -> None:
        self.parent, self.replies = parent, replies  # each reply ends with the EOS token
        self.bias = bias or [0.0] * len(replies)  # SamplingParams.choice_bias, added when picking
        self.prompt_len = parent.num_prompt_tokens
        self.first: torch.Tensor | None = None  # log-probs of the token after the prompt
        self.logprobs: list[dict[int, float]] = [{} for _ in replies]  # position -> log p(token)
        self.children: list[Sequence] = []

    @property
    def longest(self) -> int:
        """Positions the longest child takes: prompt, reply and its EOS."""
        return self.prompt_len + max(len(r) for r in self.replies)

    def spawn(self) -> list[Sequence]:
        """One prefill-only sequence per reply, once the parent's prompt is computed."""
        parent = self.parent
        for i, reply in enumerate(self.replies):
            child = Sequence(f"{parent.request_id}#choice{i}", [*parent.token_ids[: self.prompt_len], *reply],
                             parent.params)
            child.scoring, child.choice_index = self, i
            child.compute_from = self.prompt_len  # the prompt from the cache, never the reply
            self.children.append(child)
        return self.children

    def targets(self, seq: Sequence, start: int, n: int) -> list[tuple[int, int | None]]:
        """The positions of the chunk ``[start, start + n)`` whose next-token log-probability
        counts, with that token (None for the parent's last row: every reply's first token)."""
        if seq is self.parent:
            return [(start + n - 1, None)] if start + n == self.prompt_len else []
        first = max(start, self.prompt_len - 1)
        return [(p, seq.token_ids[p + 1]) for p in range(first, min(start + n, seq.num_tokens - 1))]

    def record(self, seq: Sequence, position: int, value: torch.Tensor | float) -> None:
        """Keep a row's log-probabilities: the whole row for the parent, the token's for a child."""
        if seq is self.parent:
            self.first = value.cpu()
        else:
            self.logprobs[seq.choice_index][position] = value

    def done(self) -> bool:
        return bool(self.children) and all(child.is_finished for child in self.children)

    def scores(self) -> list[float]:
        """Each reply's mean log-probability per token (EOS included)."""
        out = []
        for reply, seen in zip(self.replies, self.logprobs, strict=True):
            first = self.prompt_len - 1
            values = [seen[first] if first in seen else float(self.first[reply[0]])]
            values += [seen[p] for p in range(first + 1, first + len(reply))]
            out.append(sum(values) / len(values))
        return out

    def pick(self, temperature: float, generator: torch.Generator | None) -> list[int]:
        """The reply chosen: the best score plus bias when greedy (the first of equals), else
        drawn."""
        scores = torch.tensor(self.scores(), dtype=torch.float64) + torch.tensor(self.bias, dtype=torch.float64)
        if temperature == 0:
            return self.replies[int(scores.argmax())]
        weights = torch.softmax(scores / temperature, dim=0).float()
        if generator is not None:
            weights = weights.to(generator.device)
        return self.replies[int(torch.multinomial(weights, 1, generator=generator))]
