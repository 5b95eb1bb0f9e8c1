"""The random-shape sweep (#54): for every model family, tiny random configs (heads, KV heads, head
and rotary dims, q LoRA on or off and its rank, latent ranks, indexer heads 1-32 and dims, top-k,
indexer and MoE layer patterns, experts, experts a token, groups, shared experts, tied
embeddings, windows and routes), each checked at every position against its reference and
through every way the engine computes it (one full forward, a cache filled by a prefix then one
token a call, random chunks, the paged batched engine with chunked prefill, small blocks, a
shared prefix and sometimes preemption), with the compiled CPU kernels on and off.

The seed is fresh each run and printed in the header and the summary (tests/inference/conftest.py)
and in every failure; `SWEEP_SEED=<seed>` reruns the same shapes (tests/inference/shape_sweep.py).
"""

import pytest
import torch

from inference.config import ModelConfig
from inference.layers.caches.layouts import cache_layout
from inference.loader import load_model
from inference.sampling_params import SamplingParams
from tests.inference.engine.conftest import engine_for, reference
from tests.inference.helpers import random_state, write_checkpoint
from tests.inference.shape_sweep import (
    SHAPES,
    TALLY,
    Shape,
    ambiguity_probe,
    atol_for,
    checkpoint_dir,
    chunking,
    chunks_atol,
    cpu_kernels_set,
    glm5_sparse_reference,
    greedy_ambiguous,
    hf_model,
    make_shape,
    shape_count,
)

pytestmark = pytest.mark.slow  # 212 shapes: 61 s on a quiet 2-core AVX-512 EPYC, 2 min 11 s shared (7 Dec 2026)

CASES = [(family, index) for family in SHAPES for index in range(shape_count(family))]


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(len(ids)), model.new_cache()))


def chunked(model, ids: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    cache, outs, a = model.new_cache(), [], 0
    with torch.inference_mode():
        for size in sizes:
            outs.append(model.compute_logits(model(ids[a : a + size], torch.arange(a, a + size), cache)))
            a += size
    return torch.cat(outs)


def probed(model, ids: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """One full forward's logits, the first position of a near tie (0 < gap <= MARGIN: may fall
    another way in another order of summation, transformers' included) and the first of any
    tie (exact ones too: broken by row length)."""
    with ambiguity_probe() as (near, exact):
        logits = logits_of(model, ids)
    n = len(ids)
    first_near = min(near, default=n)
    return logits, first_near, min(first_near, min(exact, default=n))


def prepare(shape: Shape, root) -> tuple:
    """The shape's checkpoint on disk, its prompt and its reference logits (transformers', or
    glm5_sparse's own reading), and the first position its reference calls ambiguous."""
    path = checkpoint_dir(root, shape)
    if shape.family == "glm5_sparse":
        config = ModelConfig.from_dict(shape.config)
        torch.manual_seed(shape.rng.randrange(1 << 30))
        state = random_state(config)
        write_checkpoint(path, shape.config, state)
        ids = torch.tensor([shape.rng.randrange(3, config.vocab_size) for _ in range(shape.length)])
        expected, ambiguous = glm5_sparse_reference(config, state, ids)
        return path, ids, expected, ambiguous
    hf = hf_model(shape)
    hf.save_pretrained(path)
    ids = torch.tensor([shape.rng.randrange(3, shape.config["vocab_size"]) for _ in range(shape.length)])
    with torch.no_grad():
        expected = hf(ids[None], use_cache=False).logits[0]  # (transformers' cache needs an attention layer)
    return path, ids, expected, shape.length


def engine_case(shape: Shape, ids: torch.Tensor) -> dict:
    """The paged engine's run for the shape: prompts (the shape's, another, and one sharing the
    shape's first positions), block size, chunk budget and a KV budget that is sometimes tight."""
    rng, vocab = shape.rng, int(shape.config["vocab_size"])
    cut = rng.randint(1, len(ids))
    shared = ids[:cut].tolist() + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 8))]
    prompts = [ids.tolist(), shared]
    tokens = rng.randint(2, 5)
    # glm5_sparse: a block holds whole key-node blocks (global_interval)
    block = shape.config.get("global_interval", 1) * rng.choice([1, 2, 4]) if shape.family == "glm5_sparse" \
        else rng.choice([2, 4, 8, 16])
    return dict(prompts=prompts, params=SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True),
                block_size=block, tight=rng.random() < 0.4, max_num_batched_tokens=rng.choice([3, 8, 16, 64]))


def kv_blocks(model, case: dict) -> int:
    """Blocks for every sequence at once, or (`tight`) for the longest alone plus one: preemption.
    The longest a pool holds is the layout's (glm5_sparse: its window and key-node pages)."""
    layout, block = cache_layout(model.config), case["block_size"]
    lengths = [len(p) + case["params"].max_tokens for p in case["prompts"]]

    def fewest(length: int) -> int:
        blocks = 1
        while layout.longest_sequence(blocks, block) < length:
            blocks += 1
        return blocks

    return fewest(max(lengths)) + 1 if case["tight"] else sum(fewest(n) for n in lengths) + 1


def check_engine(model, case: dict, where: str) -> int:
    """The engine's greedy tokens against one sequence at a time (the LLM front), token by token
    up to the first position where the sequence's own full forward was ambiguous; returns how
    many tokens were compared."""
    engine = engine_for(model, num_blocks=kv_blocks(model, case), block_size=case["block_size"],
                        max_num_batched_tokens=case["max_num_batched_tokens"])
    got = [o.token_ids for o in engine.generate(case["prompts"], case["params"])]
    expected = reference(model, case["prompts"], case["params"])
    compared = 0
    for prompt, mine, theirs in zip(case["prompts"], got, expected, strict=True):
        sequence = torch.tensor(prompt + theirs)
        logits, _, ambiguous = probed(model, sequence)
        ambiguous = min(ambiguous, greedy_ambiguous(logits[len(prompt) - 1 :]) + len(prompt) - 1)
        upto = max(0, min(len(theirs), ambiguous - len(prompt) + 1))
        assert mine[:upto] == theirs[:upto], f"{where}: the engine's tokens for a prompt of {len(prompt)}"
        compared += upto
    assert engine.block_manager.all_free(), where
    return compared


@pytest.mark.parametrize("family, index", CASES, ids=[f"{f}-{i}" for f, i in CASES])
def test_every_path_matches_the_reference(family, index, tmp_path):
    shape = make_shape(family, index)
    path, ids, expected, reference_ambiguous = prepare(shape, tmp_path)
    # the decode from a prefix of at least half the prompt (each position is also in the chunks)
    chunks, prefix = chunking(shape.rng, len(ids)), shape.rng.randint(len(ids) // 2, len(ids) - 1)
    # the decode runs under one setting, at random; the engine too, for two shapes in three
    decode_kernels, engine_kernels = shape.rng.random() < 0.5, shape.rng.choice([False, True, None])
    case = engine_case(shape, ids)
    atol = atol_for(expected, family)
    for on in (False, True):
        with cpu_kernels_set(on) as built:
            where = f"{shape.describe()}, CPU kernels {'on' if built else 'off'}"
            model = load_model(path, ModelConfig.from_pretrained(path), "cpu")
            full, near, ambiguous = probed(model, ids)
            near, ambiguous = min(near, reference_ambiguous), min(ambiguous, reference_ambiguous)
            # one full forward against the reference: every position before a near tie (exact ties
            # too, which torch's top-k breaks as transformers' does on rows of the same length)
            torch.testing.assert_close(full[:near], expected[:near], atol=atol, rtol=1e-5,
                                       msg=lambda m, w=where: f"{w}: full forward vs reference: {m}")
            # a cache filled by a prefix, then one token a call; random chunks
            paths = [(f"chunks {chunks}", chunked(model, ids, chunks))]
            if on == decode_kernels:
                paths.append((f"decode after {prefix}", chunked(model, ids, [prefix] + [1] * (len(ids) - prefix))))
            for name, got in paths:
                torch.testing.assert_close(got[:ambiguous], full[:ambiguous], atol=chunks_atol(family), rtol=1e-5,
                                           msg=lambda m, w=where, n=name: f"{w}: {n} vs full forward: {m}")
            tokens = check_engine(model, case, where) if on == engine_kernels else 0
            TALLY.add(family, on and built, positions=min(near, len(ids)), tokens=tokens)
