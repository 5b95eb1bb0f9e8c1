"""The random-shape sweep's parts (#54, DESIGN.md "Real GLM families"): a tiny random config of a
family from a seeded generator, its reference logits (transformers 5.24's modelling code; for
`glm5_sparse`, this project's own architecture, a plain reading of the sparse contract), and
where the reference itself is ambiguous.

One seed a run: `SWEEP_SEED` when set (to rerun a failure), else a fresh one; every shape's
config, prompt and chunking come from `random.Random(f"{SEED}/{family}/{index}")`, so a failing
test id plus the seed (printed in the run's header and summary, and in each failure) is enough
to reproduce it alone.

Ambiguity: a discrete choice on a near tie (an indexer's k-th against its (k+1)-th score, a
router's experts, a key-node election, a routed path at its threshold) may fall either way
under another order of summation, and an exact tie is broken by torch's top-k in a way that
depends on the row's length (a chunked prefill's rows are shorter than one full forward's). Every
position from the first such choice on is left out of the comparisons between paths (never of
the comparison of one full forward with transformers, whose rows the engine's are); the number
of positions compared is part of what a test asserts.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import torch

from inference.config import ModelConfig
from inference.layers.dsa_indexer import Indexer
from inference.layers.kernels import cpu_kernels
from inference.layers.moe import TopkRouter
from inference.layers.pooled_dsa import PooledIndexer

SEED = int(os.environ.get("SWEEP_SEED") or secrets.randbits(31))
# shapes a family and run (x SWEEP_SCALE, for a longer local run): 212 in all
SHAPES = {"glm4": 36, "glm4_moe": 36, "glm4_moe_lite": 36, "glm_moe_dsa": 44, "glm5_next": 30, "glm5_sparse": 30}
SCALE = float(os.environ.get("SWEEP_SCALE", "1"))
MARGIN = 1e-4  # a choice closer than this (relative to the values, at least absolute) is a near tie


def shape_count(family: str) -> int:
    return max(1, round(SHAPES[family] * SCALE))


def rerun_hint() -> str:
    return f"shape sweep seed {SEED} (rerun: SWEEP_SEED={SEED})"


@contextlib.contextmanager
def cpu_kernels_set(on: bool):
    """The compiled CPU kernels on or off (`INFERENCE_CPU_KERNELS`) for what runs inside: load
    and run a model within one setting (the loader installs fast paths on what it finds)."""
    before = os.environ.get("INFERENCE_CPU_KERNELS")
    os.environ["INFERENCE_CPU_KERNELS"] = "1" if on else "0"
    cpu_kernels.library.cache_clear()
    try:
        yield cpu_kernels.available()
    finally:
        if before is None:
            os.environ.pop("INFERENCE_CPU_KERNELS")
        else:
            os.environ["INFERENCE_CPU_KERNELS"] = before
        cpu_kernels.library.cache_clear()


@dataclass
class Shape:
    """One random case: the family, its config's keyword arguments, and the inputs to run."""

    family: str
    index: int
    config: dict
    length: int  # prompt positions checked
    rng: random.Random = field(repr=False, default_factory=random.Random)

    def describe(self) -> str:
        return f"{self.family}[{self.index}] {rerun_hint()}: {self.config}, length {self.length}"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _rotary(rng: random.Random, head_dim: int) -> float:
    """A partial rotary factor whose rotary part is even and not empty."""
    return rng.choice([f for f in (0.25, 0.5, 0.75, 1.0) if (head_dim * f) % 2 == 0 and head_dim * f >= 2])


def _common(rng: random.Random) -> dict:
    return dict(vocab_size=rng.randint(40, 200), hidden_size=rng.choice([16, 24, 32, 48, 64]),
                intermediate_size=rng.choice([16, 40, 64, 96]), num_hidden_layers=rng.randint(1, 3),
                tie_word_embeddings=rng.random() < 0.3, pad_token_id=0, eos_token_id=[1, 2],
                initializer_range=0.2)  # peaky logits: greedy decisions far from ties


def _gqa(rng: random.Random) -> dict:
    heads = rng.choice([1, 2, 3, 4, 6, 8])
    head_dim = rng.choice([4, 8, 12, 16, 24, 32])
    return dict(num_attention_heads=heads, num_key_value_heads=rng.choice(_divisors(heads)), head_dim=head_dim,
                partial_rotary_factor=_rotary(rng, head_dim), attention_bias=rng.random() < 0.5,
                rope_theta=rng.choice([500.0, 10000.0, 1e6]))


def _experts(rng: random.Random, layers: int) -> dict:
    experts = rng.choice([2, 4, 6, 8, 12, 16])
    group = rng.choice([g for g in _divisors(experts) if g == 1 or experts // g >= 2])
    topk_group = rng.randint(1, group)
    return dict(n_routed_experts=experts, n_group=group, topk_group=topk_group,
                num_experts_per_tok=rng.randint(1, topk_group * (experts // group)),
                moe_intermediate_size=rng.choice([8, 16, 24]), n_shared_experts=rng.randint(1, 2),
                routed_scaling_factor=round(rng.uniform(0.5, 3.0), 2), norm_topk_prob=rng.random() < 0.7)


def _mla(rng: random.Random, lora_optional: bool) -> dict:
    heads = rng.choice([1, 2, 3, 4, 8])
    rope = rng.choice([2, 4, 8, 16])
    q_lora = rng.choice([8, 16, 32]) if not lora_optional or rng.random() < 0.7 else None
    return dict(num_attention_heads=heads, num_key_value_heads=heads, q_lora_rank=q_lora,
                kv_lora_rank=rng.choice([8, 16, 24, 48]), qk_nope_head_dim=rng.choice([4, 8, 12, 16]),
                qk_rope_head_dim=rope, v_head_dim=rng.choice([4, 8, 12, 20]))


def _next(rng: random.Random, layers: int) -> dict:
    """glm5_next's own fields: a KDA/sparse layer pattern (a "shared" sparse layer only right after
    a full one, as transformers hands a choice on), pools, KDA heads and gate, streams."""
    kinds = [rng.choice(["linear_attention", "indexed_attention"]) for _ in range(rng.randint(1, 4))]
    kinds[rng.randrange(len(kinds))] = "indexed_attention"  # one at least (an all-KDA config is refused)
    indexers = []
    for i, kind in enumerate(kinds):
        after_full = i > 0 and kinds[i - 1] == "indexed_attention" and indexers[i - 1] == "full"
        indexers.append("shared" if kind == "indexed_attention" and after_full and rng.random() < 0.5 else "full")
    heads = rng.choice([1, 2, 4])
    pool = rng.choice([1, 2, 4, 8])
    return dict(layer_types=kinds, indexer_types=indexers, num_attention_heads=heads, num_key_value_heads=heads,
                q_lora_rank=rng.choice([8, 16, 32]), kv_lora_rank=rng.choice([8, 16, 24]), qk_rope_head_dim=0,
                qk_nope_head_dim=rng.choice([4, 8, 16]), v_head_dim=rng.choice([4, 8, 12]),
                index_n_heads=rng.choice([1, 2, 4, 8, 16, 32]), index_head_dim=rng.choice([4, 8, 16]),
                index_kpool=pool, index_topk=pool * rng.randint(1, 4),
                index_kpool_always_select_tail=rng.random() < 0.7, linear_num_heads=rng.choice([1, 2, 4]),
                linear_head_dim=rng.choice([4, 8, 16]), linear_conv_kernel_dim=rng.choice([2, 3, 4]),
                linear_lower_bound=rng.choice([-5.0, -2.0, None]), hc_mult=rng.choice([1, 2, 3, 4]),
                hc_sinkhorn_iters=rng.randint(1, 20), swiglu_limit=rng.choice([1.0, 3.0, 10.0]))


def _layer_pattern(rng: random.Random, layers: int, letters: str) -> list[str]:
    return [rng.choice(letters) for _ in range(layers)]


def make_shape(family: str, index: int) -> Shape:
    rng = random.Random(f"{SEED}/{family}/{index}")
    config = _common(rng)
    layers = config["num_hidden_layers"]
    if family == "glm4":
        config |= _gqa(rng)
        length = rng.randint(6, 32)
    elif family == "glm4_moe":
        config |= _gqa(rng) | _experts(rng, layers)
        config |= dict(use_qk_norm=rng.random() < 0.5, first_k_dense_replace=rng.randint(0, layers))
        length = rng.randint(6, 32)
    elif family == "glm4_moe_lite":
        config |= _mla(rng, lora_optional=True) | _experts(rng, layers)
        config |= dict(mlp_layer_types=[rng.choice(["dense", "sparse"]) for _ in range(layers)],
                       rope_interleave=rng.random() < 0.7, rope_theta=rng.choice([500.0, 10000.0]))
        length = rng.randint(6, 32)
    elif family == "glm_moe_dsa":
        config |= _mla(rng, lora_optional=False) | _experts(rng, layers)
        pattern = "F" + "".join(rng.choice("FS") for _ in range(layers - 1))
        config |= dict(mlp_layer_types=[rng.choice(["dense", "sparse"]) for _ in range(layers)],
                       index_topk_pattern=pattern, index_n_heads=rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 20, 32]),
                       index_head_dim=config["qk_rope_head_dim"] + rng.choice([0, 2, 4, 8, 16]),
                       index_topk=rng.randint(1, 10))
        length = rng.randint(config["index_topk"] + 4, 36)  # the choice matters from position index_topk on
    elif family == "glm5_next":
        config |= _experts(rng, layers) | _next(rng, layers)
        config["num_hidden_layers"] = layers = len(config["layer_types"])
        config["mlp_layer_types"] = [rng.choice(["dense", "sparse"]) for _ in range(layers)]
        pool, topk = config["index_kpool"], config["index_topk"]
        length = rng.randint(min(topk + 2 * pool, 40), 40)
    elif family == "glm5_sparse":
        config |= _gqa(rng)
        window = rng.choice([4, 6, 8, 12, 16])
        config |= dict(model_type="glm5_sparse", sliding_window=window,
                       global_interval=rng.choice([d for d in range(1, window + 1)]), routed=rng.random() < 0.6,
                       route_threshold=rng.choice([0.0, 0.1, 0.2, 0.3]), num_mtp_heads=0, dtype="float32")
        config["rope_parameters"] = {"rope_theta": config.pop("rope_theta"),
                                     "partial_rotary_factor": config.pop("partial_rotary_factor")}
        for key in ("pad_token_id", "initializer_range"):
            config.pop(key)
        length = rng.randint(6, 40)
    else:
        raise ValueError(f"no generator for {family!r}")
    return Shape(family, index, config, length, rng)


# ---- references ----------------------------------------------------------------------------

def hf_model(shape: Shape):
    """The transformers model of a (transformers) family's shape, random, with its router biases
    and norms off their neutral values (tests.inference.helpers.unsettle_)."""
    import transformers

    from tests.inference.helpers import unsettle_

    if shape.family == "glm5_next":
        from tests.inference.test_glm5_next import make_hf

        kwargs = dict(shape.config)
        tie = kwargs.pop("tie_word_embeddings")
        return make_hf(shape.rng.randrange(1 << 30), tie=tie, **kwargs)

    names = {"glm4": ("Glm4Config", "Glm4ForCausalLM"), "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM"),
             "glm4_moe_lite": ("Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM"),
             "glm_moe_dsa": ("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM")}[shape.family]
    kwargs = dict(shape.config)
    if "rope_theta" in kwargs:
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": kwargs.pop("rope_theta"),
                                     **({"partial_rotary_factor": kwargs.pop("partial_rotary_factor")}
                                        if "partial_rotary_factor" in kwargs else {})}
    config = getattr(transformers, names[0])(**kwargs)
    torch.manual_seed(shape.rng.randrange(1 << 30))
    return unsettle_(getattr(transformers, names[1])(config).eval())


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate_pairs(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float) -> torch.Tensor:
    """GLM's interleaved-pair rotary on the first `rotary_dim` channels of `x [L, heads, D]`."""
    inv = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angle = positions.double()[:, None] * inv[None]
    cos, sin = angle.cos().float()[:, None], angle.sin().float()[:, None]
    even, odd = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
    out = x.clone()
    out[..., 0:rotary_dim:2] = even * cos - odd * sin
    out[..., 1:rotary_dim:2] = even * sin + odd * cos
    return out


def glm5_sparse_reference(config: ModelConfig, state: dict[str, torch.Tensor],
                          ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """This project's architecture (inference/models/glm5_sparse.py) read plainly from its
    checkpoint tensors, attention by the sparse contract's reference
    (tests/inference/test_sparse_attention.py): logits `[L, vocab]` and the first position
    whose key-node election or routed path was a near tie (L where none)."""
    from tests.inference.test_sparse_attention import reference

    n, eps = len(ids), config.rms_norm_eps
    heads, kv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    window, interval = config.sliding_window, config.global_interval
    positions, first_ambiguous = torch.arange(n), n
    h = state["model.embed_tokens.weight"][ids]
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        x = _rms(h, state[p + "input_layernorm.weight"], eps)

        def project(name: str, x=x, p=p) -> torch.Tensor:
            out = x @ state[p + f"self_attn.{name}.weight"].t()
            bias = state.get(p + f"self_attn.{name}.bias")
            return out if bias is None else out + bias

        q = _rotate_pairs(project("q_proj").view(n, heads, d), positions, config.rotary_dim, config.rope_theta)
        k = _rotate_pairs(project("k_proj").view(n, kv, d), positions, config.rotary_dim, config.rope_theta)
        v = project("v_proj").view(n, kv, d)
        norms = torch.linalg.vector_norm(h, dim=-1)
        for b in range(n // interval):  # a near tie in a block's election: from the first query that sees it
            top = norms[b * interval : (b + 1) * interval].sort(descending=True).values
            if interval > 1 and top[0] - top[1] < MARGIN * top[0]:
                first_ambiguous = min(first_ambiguous, b * interval + interval - 1 + window)
        gate = None
        if config.routed:
            probs = torch.softmax(x @ state[p + "router.weight"].t(), dim=-1)[:, :2]
            near = ((probs - config.route_threshold).abs() < MARGIN).any(dim=-1).nonzero()
            if len(near) and config.route_threshold > 0:
                first_ambiguous = min(first_ambiguous, int(near[0]))
            gate = torch.where(probs >= config.route_threshold, probs, torch.zeros_like(probs))
        out = reference(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), norms, window, interval, gate)
        h = h + out.transpose(0, 1).reshape(n, heads * d) @ state[p + "self_attn.o_proj.weight"].t()
        y = _rms(h, state[p + "post_attention_layernorm.weight"], eps) @ state[p + "mlp.gate_up_proj.weight"].t()
        gate_part, up = y.chunk(2, dim=-1)
        h = h + (torch.nn.functional.silu(gate_part) * up) @ state[p + "mlp.down_proj.weight"].t()
    h = _rms(h, state["model.norm.weight"], eps)
    head = state["model.embed_tokens.weight"] if config.tie_word_embeddings else state["lm_head.weight"]
    return h @ head.t(), first_ambiguous


# ---- ambiguity of the engine's own full forward ------------------------------------------------

def _near(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of `values [R, N]` whose k-th and (k+1)-th largest are within MARGIN but not equal,
    and rows where they are equal (bool `[R]` each)."""
    if k >= values.shape[-1]:
        none = torch.zeros(values.shape[0], dtype=torch.bool)
        return none, none
    top = values.topk(k + 1, dim=-1).values
    a, b = top[:, k - 1], top[:, k]
    finite = torch.isfinite(a)
    return (a - b <= MARGIN * torch.maximum(a.abs(), torch.ones_like(a))) & (a != b) & finite, (a == b) & finite


@contextlib.contextmanager
def ambiguity_probe():
    """Records, while a full forward of one sequence runs (positions 0..L-1 in order: a row is
    its position), the positions at which a router or indexer choice was a near tie, and those
    where it was an exact one: yields the two lists."""
    near_ties: list[int] = []
    exact_ties: list[int] = []

    def note(near: torch.Tensor, exact: torch.Tensor, positions: torch.Tensor) -> None:
        near_ties.extend(positions[near].tolist())
        exact_ties.extend(positions[exact].tolist())

    route, select = TopkRouter.forward, Indexer.select

    def routed(self, x):
        scores = torch.sigmoid(x.float() @ self.weight.float().t())
        choice = scores + self.e_score_correction_bias.float()
        rows = torch.arange(x.shape[0])
        if self.topk_group < self.n_group:
            groups = choice.view(x.shape[0], self.n_group, -1)
            merit = groups.topk(2, dim=-1).values.sum(dim=-1)
            note(*_near(merit, self.topk_group), rows)
            kept = torch.zeros_like(merit, dtype=torch.bool)
            kept.scatter_(1, merit.topk(self.topk_group, dim=-1).indices, True)
            choice = groups.masked_fill(~kept[..., None], float("-inf")).view(x.shape[0], -1)
        note(*_near(choice, self.top_k), rows)
        return route(self, x)

    def selected(self, x, q_resid, rotations, keys, positions, slots=None):
        from inference.layers.rotary import apply_rotary_

        n = x.shape[0]
        q = apply_rotary_(self.wq_b(q_resid).view(n, self.heads, self.head_dim).contiguous(), rotations).float()
        w = self.weights_proj(x).float() * self.heads**-0.5
        k = (keys if slots is None else keys[slots]).float()
        scores = torch.einsum("nh,nht->nt", w, torch.einsum("nhd,td->nht", q, k).mul(self.head_dim**-0.5).relu())
        scores = scores.masked_fill(torch.arange(k.shape[0])[None] > positions[:, None], float("-inf"))
        near, exact = _near(scores, self.topk)
        chooses = positions + 1 > self.topk  # fewer positions than k: all of them, no choice
        note(near & chooses, exact & chooses, positions)
        return select(self, x, q_resid, rotations, keys, positions, slots)

    def pooled(self, x, q_resid, keys, positions):
        pools = self.pooled(keys)
        q = self.wq_b(q_resid).view(x.shape[0], self.heads, self.head_dim).float()
        scores = torch.matmul(q, pools.t()[None]).mul(self.head_dim**-0.5).relu()
        index = torch.matmul((self.weights_proj(x).float() * self.heads**-0.5)[:, None], scores)[:, 0]
        ends = torch.arange(1, pools.shape[0] + 1) * self.pool - 1
        index = index.masked_fill(ends[None] > positions[:, None], float("-inf"))
        k = self.topk // self.pool
        near, exact = _near(index, k)
        chooses = (positions + 1) // self.pool > k  # fewer complete pools than k: all of them
        note(near & chooses, exact & chooses, positions)
        return pool_select(self, x, q_resid, keys, positions)

    pool_select = PooledIndexer.select
    TopkRouter.forward, Indexer.select, PooledIndexer.select = routed, selected, pooled
    try:
        yield near_ties, exact_ties
    finally:
        TopkRouter.forward, Indexer.select, PooledIndexer.select = route, select, pool_select


def greedy_ambiguous(logits: torch.Tensor) -> int:
    """The first row of `logits [L, vocab]` whose best two are within MARGIN (L where none)."""
    top = logits.topk(2, dim=-1).values
    near = (top[:, 0] - top[:, 1] <= MARGIN * top[:, 0].abs().clamp(min=1)).nonzero()
    return int(near[0]) if len(near) else logits.shape[0]


class Tally:
    """What the run's sweep compared, for the summary line (tests/inference/conftest.py)."""

    def __init__(self) -> None:
        self.shapes: dict[str, int] = {}
        self.positions = self.tokens = self.with_kernels = 0

    def add(self, family: str, kernels: bool, positions: int, tokens: int) -> None:
        if not kernels:  # each shape runs kernels off first, then on
            self.shapes[family] = self.shapes.get(family, 0) + 1
        self.with_kernels += kernels
        self.positions += positions
        self.tokens += tokens

    def summary(self) -> str:
        families = ", ".join(f"{f} {n}" for f, n in self.shapes.items())
        return (f"{rerun_hint()}: {sum(self.shapes.values())} random shapes ({families}), "
                f"{self.with_kernels} of them also with the compiled CPU kernels; "
                f"{self.positions} positions and {self.tokens} engine tokens compared")


TALLY = Tally()


def checkpoint_dir(root: Path, shape: Shape) -> Path:
    return root / f"{shape.family}-{shape.index}"


def chunking(rng: random.Random, length: int) -> list[int]:
    """Two to five random chunks that add up to `length` (the decode path does the ones)."""
    cuts = sorted(rng.sample(range(1, length), min(length - 1, rng.randint(1, 4))))
    return [b - a for a, b in zip([0, *cuts], [*cuts, length], strict=True)]


# glm5_next's KDA layers carry a delta-rule state from position to position, summed by chunks of
# other sizes here and step by step in the reference: on an Intel Xeon (AVX-512) 1.1e-4 apart from
# the reference at 40 positions and 1.9e-4 between two chunkings of the engine's own, where a wrong
# state or gate is 1e-2 and more off (tests/inference/test_glm5_next.py allowed 5e-4 the same way
# until the KDA chunk summed its gates in float64; it allows 1e-4 now)
FAMILY_NOISE = {"glm5_next": 3.0}
CHUNKS_ATOL = {"glm5_next": 5e-4}  # a cache filled in chunks against one full forward; else 5e-5


def chunks_atol(family: str) -> float:
    return CHUNKS_ATOL.get(family, 5e-5)


def atol_for(reference: torch.Tensor, family: str = "") -> float:
    """fp32 logits of a tiny random model, summed in other orders: 1e-4, more for large logits
    and for a family whose recurrent state adds its own rounding (``FAMILY_NOISE``)."""
    top = float(reference.abs().max())
    return 1e-4 * FAMILY_NOISE.get(family, 1.0) * (max(1.0, top / 10) if math.isfinite(top) else 1.0)
