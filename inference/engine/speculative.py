"""MTP speculative decoding: the model's own MTP heads draft, the model verifies.

A round: the MTP heads draft k tokens (depth d proposes the token d + 2 after the last verified
hidden state; past the last head, the last head runs on autoregressively), the main model runs
`[last token, drafts...]` in one forward, the longest accepted prefix is kept plus one token of
the model's own (the correction, or a bonus when all k pass), and every cache rolls back what was
rejected (`LayerCache.truncate`).

Acceptance is rejection sampling (Leviathan et al. 2023): draft x ~ q is kept with probability
min(1, p(x) / q(x)), else the token is drawn from norm(max(0, p - q)); so the output distribution
is exactly the model's p under the request's sampling settings. Greedy is the special case of
one-hot p and q: identical tokens to plain greedy decoding.

MTP caches follow training exactly: depth d at position j reads the depth d-1 state at j and the
token j + d + 1, so its cache keeps only positions whose inputs are verified (j <= m - d - 1 with
m the verified length) and recomputes the rest each round from `pending` rows.

The engine keeps an `MTPDrafter` per speculative sequence (`inference.engine.drafting`, which
also batches the drafts of a step's sequences depth by depth) and verifies every sequence of a
step in one batched forward (`inference.engine.model_runner`), with `verify_drafts`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from inference.layers.caches.kv_cache import KVCache
from inference.layers.kernels import cpu_kernels
from inference.layers.linear import Int8Linear, quantize_linears_, weight_key
from inference.layers.sampler import Sampler
from inference.models.glm5_sparse import Glm5SparseForCausalLM
from inference.sampling_params import SamplingParams

MAX_DRAFT = 8


@dataclass
class SpeculativeStats:
    """Per draft position i: drafts proposed and accepted; `rounds` main-model verify forwards
    and the tokens they produced (accepted drafts plus the model's own token each)."""

    k: int
    proposed: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    rounds: int = 0
    emitted: int = 0
    length_counts: list[int] = field(default_factory=list)  # [n]: rounds that accepted n drafts

    def __post_init__(self) -> None:
        self.proposed = self.proposed or [0] * self.k
        self.accepted = self.accepted or [0] * self.k
        self.length_counts = self.length_counts or [0] * (self.k + 1)

    def count(self, drafted: int, accepted: int) -> None:
        """One verify round that checked `drafted` drafts and kept the first `accepted`."""
        for i in range(drafted):
            self.proposed[i] += 1
            self.accepted[i] += i < accepted
        self.rounds += 1
        self.emitted += accepted + 1
        self.length_counts[accepted] += 1

    def since(self, earlier: SpeculativeStats) -> SpeculativeStats:
        """What was counted after `earlier`, a copy of these stats taken then (the engine sums
        every request's rounds; one request's are the difference around it)."""
        return SpeculativeStats(
            self.k, [a - b for a, b in zip(self.proposed, earlier.proposed, strict=True)],
            [a - b for a, b in zip(self.accepted, earlier.accepted, strict=True)],
            self.rounds - earlier.rounds, self.emitted - earlier.emitted,
            [a - b for a, b in zip(self.length_counts, earlier.length_counts, strict=True)])

    @property
    def acceptance(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted, self.proposed, strict=True)]

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verify forward (accepted drafts + 1); plain decoding is 1."""
        return self.emitted / self.rounds if self.rounds else 0.0


class Chooser:
    """Next-token choice under one request's SamplingParams: the token and the distribution it
    was drawn from (None for plain greedy, where only the argmax matters)."""

    def __init__(
        self, sampler: Sampler, params: SamplingParams, generator: torch.Generator | None
    ) -> None:
        self.sampler, self.params, self.generator = sampler, params, generator
        self.plain_greedy = params.is_greedy and params.repetition_penalty == 1.0

    def probs(self, logits: torch.Tensor, history: list[int]) -> torch.Tensor:
        return self.sampler.probs(logits, [self.params], [history])[0]

    def draw(self, probs: torch.Tensor) -> int:
        if self.params.is_greedy:
            return int(probs.argmax())
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def choose(
        self, logits: torch.Tensor, history: list[int] | None
    ) -> tuple[int, torch.Tensor | None]:
        """`history` may be None for plain greedy, which does not read it."""
        if self.plain_greedy:
            return int(logits[0].argmax()), None
        probs = self.probs(logits, history)
        return self.draw(probs), probs

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))


# fp32 draft weights (MTP modules + lm head) up to this size draft in fp32 where the CPU kernels
# are built (inference/models/cpu_decode.py): they stay in the caches, so reading a quarter of
# the bytes buys little and the fused fp32 layer's fewer ops win (demo model, ~10 MiB of them:
# batch-1 decode 1604 tok/s fp32 against 1283 int8). Larger ones read from memory: int8 there.
FP32_DRAFT_MAX_BYTES = 32 << 20


class DraftModules:
    """What drafts run: on CPU int8 (W8A16) copies of the MTP modules and of the lm head, made
    once per model and remade when a weight changes; the model's own fp32 ones where they are
    small and the CPU kernels are built (`FP32_DRAFT_MAX_BYTES`). Before the fused fp32 layer,
    int8 drafted about twice as fast as fp32 on the demo model (the lm head alone is the largest
    matrix, read at every draft position).
    Drafts need not be exact: the main model verifies them and rejection sampling uses the very
    distribution a draft was drawn from, so greedy stays lossless and sampling exact."""

    def __init__(self, model: Glm5SparseForCausalLM) -> None:
        self.model = model
        self._key: tuple | None = None
        self.mtp: list[torch.nn.Module | None] = []
        self.head: torch.nn.Module | None = None

    def refresh(self) -> None:
        model = self.model
        if model.device.type != "cpu" or not isinstance(model.lm_head, torch.nn.Linear) or _fp32_drafts(model):
            self.mtp, self.head = [None] * len(model.model.mtp), None  # the model's own
            return
        key = tuple(weight_key(p) for p in (*model.model.mtp.parameters(), model.lm_head.weight))
        if key != self._key:
            self.mtp = [quantize_linears_(copy.deepcopy(m)).eval() for m in model.model.mtp]
            self.head = Int8Linear.from_linear(model.lm_head)
            self._key = key

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden) if self.head is None else self.head(hidden)


def _fp32_drafts(model: Glm5SparseForCausalLM) -> bool:
    """Whether the model's own fp32 draft weights beat int8 copies here (see FP32_DRAFT_MAX_BYTES)."""
    weights = [*model.model.mtp.parameters(), model.lm_head.weight]
    if any(w.dtype != torch.float32 for w in weights) or not cpu_kernels.available():
        return False
    return sum(w.numel() * w.element_size() for w in weights) <= FP32_DRAFT_MAX_BYTES


def draft_modules(model: Glm5SparseForCausalLM) -> DraftModules:
    """The model's `DraftModules`, kept on the model so that every request shares them."""
    modules = model.__dict__.get("_draft_modules")
    if modules is None:
        modules = model.__dict__["_draft_modules"] = DraftModules(model)
    modules.refresh()
    return modules


def no_mtp_message(config) -> str:
    """Why a model without MTP heads cannot decode speculatively, and where the heads would be."""
    where = ""
    if config.num_nextn_predict_layers:
        where = (f": this {config.model_type} checkpoint lacks the MTP layer model.layers.{config.num_hidden_layers}.* "
                 "that the published ones carry (transformers' save_pretrained drops it)")
    return f"speculative decoding needs a checkpoint with MTP heads (num_mtp_heads > 0){where}"


class MTPDrafter:
    """The MTP heads of one sequence and their caches (the last layers of `cache`).

    `base`: the first position whose main-model hidden state the drafter is given (the serving
    engine does not compute the positions a prefix-cache hit serves): the MTP caches hold
    positions `[base, ...)` only, so drafts see a shorter context there. That changes only how
    often drafts are accepted, never the output: the main model verifies every draft."""

    def __init__(self, model: Glm5SparseForCausalLM, cache: KVCache, k: int, base: int = 0) -> None:
        heads = model.config.num_mtp_heads
        if heads == 0:
            raise ValueError(no_mtp_message(model.config))
        self.model, self.cache, self.k, self.base = model, cache, k, base
        self.depths = min(k, heads)
        self.window = model.config.sliding_window or 2048
        self.first = model.config.num_hidden_layers  # cache layer of depth 0
        self.drafts = draft_modules(model)
        # pending[d]: depth d inputs not yet in its cache, for positions [length_d, ...): for
        # depth 0 the main model's verified hidden states, for depth d the verified outputs of
        # depth d-1 (one row between rounds).
        hidden = model.config.hidden_size
        self.pending = [
            torch.zeros(0, hidden, device=model.device, dtype=model.model.norm.weight.dtype)
        ] * self.depths

    def add_verified(self, hidden: torch.Tensor) -> None:
        """Main-model hidden states of newly verified positions."""
        pending = self.pending[0]
        self.pending[0] = hidden if pending.shape[0] == 0 else torch.cat((pending, hidden))

    @property
    def num_pending(self) -> int:
        """Verified depth-0 inputs not yet run: drafting needs at least one."""
        return self.pending[0].shape[0]

    def _run(self, depth: int, hidden: torch.Tensor, ids: list[int], start: int) -> torch.Tensor:
        """Depth `depth` over cache rows `[start, start + len(ids))` (positions `base + start ...`),
        in pieces no longer than the window so that the newest positions can always be rolled back."""
        device, outs = self.model.device, []
        start += self.base
        for a in range(0, len(ids), self.window):
            b = min(a + self.window, len(ids))
            positions = torch.arange(start + a, start + b, device=device)
            piece = torch.tensor(ids[a:b], device=device)
            outs.append(
                self.model.mtp_forward(
                    depth, hidden[a:b], piece, positions, self.cache, self.drafts.mtp[depth]
                )
            )
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def draft(
        self, tokens: list[int], k: int, chooser: Chooser
    ) -> tuple[list[int], list[torch.Tensor | None]]:
        """Up to `k` drafts after `tokens` (all verified; the last one not yet run by the model)."""
        base = self.base
        m = len(tokens) - 1 - base  # positions [base, base + m) are in the main cache
        drafts: list[int] = []
        dists: list[torch.Tensor | None] = []

        def choose(hidden: torch.Tensor) -> None:
            history = None if chooser.plain_greedy else tokens + drafts
            choice, dist = chooser.choose(self.drafts.logits(hidden), history)
            drafts.append(choice)
            dists.append(dist)

        out = None
        for d in range(min(k, self.depths)):
            layer = self.cache.layers[self.first + d]
            start = layer.length
            # depth d inputs for [start, m): its pending rows, then depth d-1's fresh outputs
            pending = self.pending[d]
            inputs = pending if d == 0 else out if pending.shape[0] == 0 else torch.cat((pending, out))
            assert inputs.shape[0] == m - start, "MTP caches out of step"
            # position j reads token j + d + 1: verified tokens, then the d drafts so far
            out = self._run(d, inputs, tokens[base + start + d + 1 :] + drafts[max(0, start + d - m) :], start)
            choose(out[-1:])
            if d == self.depths - 1:
                hidden = out[-1:]
                for _ in range(k - len(drafts)):  # past the last head: run it on autoregressively
                    hidden = self._run(d, hidden, [drafts[-1]], layer.length)
                    choose(hidden)
            # keep only positions whose inputs are verified: j <= m - d - 1
            layer.truncate(m - d)
            keep = m - d - start  # rows of `inputs` now cached
            # what stays pending is the row at m - d: depth d-1's output there is verified
            self.pending[d] = inputs[keep : keep + (1 if d else 0)]
        return drafts, dists


def verify_drafts(
    logits: torch.Tensor,
    drafts: list[int],
    dists: list[torch.Tensor | None],
    tokens: list[int],
    chooser: Chooser,
) -> tuple[int, int]:
    """How many drafts are accepted, and the token that follows them. `logits [len(drafts) + 1,
    V]`: the main model's at the last verified token and at each draft; `dists` the
    distributions the drafts were drawn from (None for plain greedy)."""
    if chooser.plain_greedy:
        targets = logits.argmax(dim=-1).tolist()
        return greedy_accept(drafts, targets)
    for i, (x, q) in enumerate(zip(drafts, dists, strict=True)):
        p = chooser.probs(logits[i : i + 1], tokens + drafts[:i])
        if chooser.params.is_greedy:
            accept = bool(p[x] > 0)  # one-hot p: accept the model's own argmax only
        else:
            accept = chooser.uniform() < min(1.0, float(p[x] / q[x]))
        if not accept:
            residual = (p - q).clamp(min=0)
            total = residual.sum()
            residual = residual / total if total > 0 else p
            return i, chooser.draw(residual)
    p = chooser.probs(logits[len(drafts) : len(drafts) + 1], tokens + drafts)
    return len(drafts), chooser.draw(p)


def greedy_accept(drafts: list[int], targets: list[int]) -> tuple[int, int]:
    """Plain greedy: the drafts that equal the model's argmax, then the model's own next token."""
    n = 0
    while n < len(drafts) and drafts[n] == targets[n]:
        n += 1
    return n, targets[n]
