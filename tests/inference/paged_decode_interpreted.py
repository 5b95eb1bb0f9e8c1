"""Runs the paged decode attention programs (inference/layers/kernels/paged_decode_triton.py) under
Triton's interpreter and prints their error against a float64 reference, as JSON.

A script of its own, started by test_paged_decode_triton.py: Triton must see TRITON_INTERPRET=1
before it is first imported.
"""

import contextlib
import json
import os
import random
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1"

import torch  # noqa: E402

from inference.layers.kernels import paged_decode_triton as kernels  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16}
# the shape sweep's seed (tests/inference/shape_sweep.py, passed by test_paged_decode_triton.py):
# one random shape a kernel beside the fixed ones
SHAPES = random.Random(f"{os.environ.get('SWEEP_SEED', '0')}/triton")


def random_gqa_shape() -> tuple[int, int, int]:
    heads = SHAPES.choice([1, 2, 3, 4, 6, 8, 12, 16])
    return heads, SHAPES.choice([d for d in range(1, heads + 1) if heads % d == 0]), \
        SHAPES.choice([8, 16, 24, 40, 64, 96, 128])


def random_latent_shape() -> tuple[int, int, int]:
    return SHAPES.choice([1, 3, 4, 8, 16, 20, 32]), SHAPES.choice([16, 32, 48, 64, 96, 128]), SHAPES.choice([8, 16, 32])


def slot_lists(lengths: list[int], pool_slots: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's slots, scattered over the pool as a block table leaves them; padded with junk."""
    width = max(lengths)
    slots = torch.randint(0, pool_slots, (len(lengths), width), generator=gen)
    for b, n in enumerate(lengths):
        slots[b, :n] = torch.randperm(pool_slots, generator=gen)[:n]
    return slots, torch.tensor(lengths)


def block_tables(lengths: list[int], page: int, pool_slots: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's block table over a pool of `pool_slots` (blocks in any order, a junk block
    past its last), and the slot list it stands for."""
    blocks = pool_slots // page
    tables = torch.randint(0, blocks, (len(lengths), -(-max(lengths) // page) + 1), generator=gen)
    slots = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for b, n in enumerate(lengths):
        used = -(-n // page)
        tables[b, :used] = torch.randperm(blocks, generator=gen)[:used]
        i = torch.arange(n)
        slots[b, :n] = tables[b, i // page] * page + i % page
    return tables, slots


def gqa_cases() -> list[dict]:
    out = []
    gen = torch.Generator().manual_seed(0)
    for heads, kv_heads, dim in ((8, 2, 64), (6, 6, 40), (12, 1, 32), random_gqa_shape()):
        for name, dtype in DTYPES.items():
            lengths = [1, 64, 65, 130]  # one key, a block exactly, one past it, several blocks
            q = torch.randn(len(lengths), heads, dim, generator=gen).to(dtype)
            pool_k = torch.randn(kv_heads, 600, dim, generator=gen).to(dtype)
            pool_v = torch.randn(kv_heads, 600, dim, generator=gen).to(dtype)
            slots, lens = slot_lists(lengths, 600, gen)
            got = kernels.gqa_decode(q, pool_k, pool_v, slots, lens)
            worst = 0.0
            for b, n in enumerate(lengths):
                k = pool_k[:, slots[b, :n]].double().repeat_interleave(heads // kv_heads, 0)  # [Hq, n, D]
                v = pool_v[:, slots[b, :n]].double().repeat_interleave(heads // kv_heads, 0)
                w = torch.softmax(torch.einsum("hd,hnd->hn", q[b].double(), k) * dim**-0.5, dim=-1)
                expected = torch.einsum("hn,hnd->hd", w, v)
                worst = max(worst, (got[b].double() - expected).abs().max().item())
            # the same rows read through block tables of 16 (dense decode): what their slot lists give
            tables, listed = block_tables(lengths, 16, 600, gen)
            paged = (kernels.gqa_decode(q, pool_k, pool_v, tables, lens, page=16)
                     - kernels.gqa_decode(q, pool_k, pool_v, listed, lens)).abs().max().item()
            paged = max(paged, sparse_paged_difference(q, pool_k, pool_v, gen))
            out.append({"shape": [heads, kv_heads, dim], "dtype": name, "error": worst, "paged_difference": paged,
                        "out_dtype": str(got.dtype).removeprefix("torch.")})
    return out


def sparse_paged_difference(q, pool_k, pool_v, gen) -> float:
    """A sparse window's decode read through block tables (each row's window from its first
    position) and node page tables (its valid key nodes, in node pools of their own), in one
    softmax (union) and apart (routed), against the slot lists those stand for."""
    node_k, node_v = pool_k[:, :200].flip(1).contiguous(), pool_v[:, :200].flip(1).contiguous()
    firsts, window, seen = torch.tensor([0, 5, 40, 70]), [1, 30, 64, 100], [0, 3, 17, 5]
    tables, listed = block_tables([f + n for f, n in zip(firsts.tolist(), window, strict=True)], 16, 600, gen)
    pages, node_listed = block_tables([max(1, n) for n in seen], 4, 200, gen)
    lists = [torch.cat((listed[b, f : f + n], node_listed[b, :m]))
             for b, (f, n, m) in enumerate(zip(firsts.tolist(), window, seen, strict=True))]
    width = max(len(x) for x in lists)
    joined = torch.stack([torch.nn.functional.pad(x, (0, width - len(x))) for x in lists])
    local, nodes = torch.tensor(window), torch.tensor(seen)
    union = kernels.gqa_decode(q, pool_k, pool_v, tables, local + nodes, second=(node_k, node_v, local), page=16,
                               firsts=firsts, node_pages=(pages, 4))
    by_list = kernels.gqa_decode(q, pool_k, pool_v, joined, local + nodes, second=(node_k, node_v, local))
    windows = torch.stack([listed[b, f : f + max(window)] if f + max(window) <= listed.shape[1] else
                           torch.nn.functional.pad(listed[b, f:], (0, f + max(window) - listed.shape[1]))
                           for b, f in enumerate(firsts.tolist())])
    local_apart = kernels.gqa_decode(q, pool_k, pool_v, tables, local, page=16, firsts=firsts)
    local_list = kernels.gqa_decode(q, pool_k, pool_v, windows, local)
    nodes_apart = kernels.gqa_decode(q, node_k, node_v, pages, nodes, page=4)
    nodes_list = kernels.gqa_decode(q, node_k, node_v, node_listed, nodes)
    return max((union - by_list).abs().max().item(), (local_apart - local_list).abs().max().item(),
               (nodes_apart - nodes_list).abs().max().item())


def gqa_prefill_cases() -> list[dict]:
    """A step of several sequences: a one-token prompt, a prompt over several query and key
    blocks, one exactly a query block, a chunk after a cached prefix, and a decode row; dense,
    then a sparse window of 24 with a key node per 4 positions (union, and routed with some
    paths' weights zeroed), where the later rows see the window slide and nodes appear."""
    out = []
    gen = torch.Generator().manual_seed(2)
    steps = [(0, 1), (0, 37), (0, 16), (50, 20), (70, 1)]  # (first position computed, rows)
    for mode in ("dense", "union", "routed"):
        window, interval = (None, None) if mode == "dense" else (24, 4)
        for heads, kv_heads, dim in ((8, 2, 64), (6, 6, 40), (12, 4, 32)):
            for name, dtype in DTYPES.items():
                out.append(prefill_case(steps, heads, kv_heads, dim, dtype, window, interval, mode, gen) | {
                    "mode": mode, "dtype": name})
    return out


def prefill_case(steps, heads, kv_heads, dim, dtype, window, interval, mode, gen) -> dict:
    tokens, group = sum(n for _, n in steps), heads // kv_heads
    q = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
    pool_k = torch.randn(kv_heads, 600, dim, generator=gen).to(dtype)
    pool_v = torch.randn(kv_heads, 600, dim, generator=gen).to(dtype)
    node_k = torch.randn(kv_heads, 90, dim, generator=gen).to(dtype)
    node_v = torch.randn(kv_heads, 90, dim, generator=gen).to(dtype)
    firsts = [0 if window is None else max(0, c - window + 1) for c, _ in steps]  # each list's first position
    slots, _ = slot_lists([c + n - f for (c, n), f in zip(steps, firsts, strict=True)], 600, gen)
    lists = [slots[b, : c + n - f] for b, ((c, n), f) in enumerate(zip(steps, firsts, strict=True))]
    counts = [0 if window is None else max(0, c + n - window) // interval for c, n in steps]
    nodes = [torch.randperm(90, generator=gen)[:count] for count in counts]
    gate = None
    if mode == "routed":
        gate = torch.rand(tokens, 2, generator=gen)
        gate[::5, 0] = 0  # a path below the router's threshold is zeroed before attention
        gate[1::7, 1] = 0
    plan = kernels.PrefillPlan.build(lists, firsts, [c for c, _ in steps], [n for _, n in steps], q.device,
                                     None if window is None else nodes)
    got = kernels.gqa_prefill(q, pool_k, pool_v, plan, window=window, interval=interval,
                              nodes=None if window is None else (node_k, node_v), gate=gate)
    worst, a = 0.0, 0
    for (c, n), own, first, chosen in zip(steps, lists, firsts, nodes, strict=True):
        k = pool_k[:, own].double().repeat_interleave(group, 0)  # [Hq, keys, D]
        v = pool_v[:, own].double().repeat_interleave(group, 0)
        nk = node_k[:, chosen].double().repeat_interleave(group, 0)
        nv = node_v[:, chosen].double().repeat_interleave(group, 0)
        for t in range(n):
            p, row = c + t, q[a + t].double()  # [Hq, D]
            keys = torch.arange(first, c + n)
            local = (keys <= p) & (keys > (p - window if window else -1))
            seen = 0 if window is None else max(0, p - window + 1) // interval
            if mode == "routed":
                expected = gate[a + t, 0].double() * attend(row, k[:, local], v[:, local], dim)
                if seen:
                    expected = expected + gate[a + t, 1].double() * attend(row, nk[:, :seen], nv[:, :seen], dim)
            else:
                expected = attend(row, torch.cat((k[:, local], nk[:, :seen]), 1),
                                  torch.cat((v[:, local], nv[:, :seen]), 1), dim)
            worst = max(worst, (got[a + t].double() - expected).abs().max().item())
        a += n
    # the same step read through block tables of 16 (and node page tables of 4), as the engine
    # passes them, against the slot lists they stand for
    tables, listed = block_tables([c + n for c, n in steps], 16, 600, gen)
    pages, node_listed = block_tables([max(1, count) for count in counts], 4, 88, gen)
    lists = [listed[b, f : c + n] for b, ((c, n), f) in enumerate(zip(steps, firsts, strict=True))]
    chosen = [node_listed[b, :count] for b, count in enumerate(counts)]
    starts, news, nodes_at = [c for c, _ in steps], [n for _, n in steps], None if window is None else (node_k, node_v)
    by_list = kernels.gqa_prefill(q, pool_k, pool_v, kernels.PrefillPlan.build(
        lists, firsts, starts, news, q.device, None if window is None else chosen),
        window=window, interval=interval, nodes=nodes_at, gate=gate)
    by_table = kernels.gqa_prefill(q, pool_k, pool_v, kernels.PrefillPlan.build(
        list(tables), firsts, starts, news, q.device, None if window is None else list(pages), page=16,
        node_page=0 if window is None else 4), window=window, interval=interval, nodes=nodes_at, gate=gate)
    return {"shape": [heads, kv_heads, dim], "error": worst, "out_dtype": str(got.dtype).removeprefix("torch."),
            "paged_difference": (by_table - by_list).abs().max().item()}


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dim: int) -> torch.Tensor:
    """`q [H, D]` against `k`/`v [H, n, D]`, float64."""
    w = torch.softmax(torch.einsum("hd,hnd->hn", q, k) * dim**-0.5, dim=-1)
    return torch.einsum("hn,hnd->hd", w, v)


def moe_cases() -> list[dict]:
    """The grouped experts (inference/layers/kernels/moe_triton.py) against `MoE.routed`'s loop: a decode
    row, a few rows, and a prefill's worth, with some experts chosen by no token and some by
    more rows than a block holds."""
    from inference.config import ModelConfig
    from inference.layers.kernels import moe_triton
    from inference.layers.moe import MoE

    out = []
    gen = torch.Generator().manual_seed(3)
    config = ModelConfig.from_dict(dict(
        model_type="glm4_moe", vocab_size=100, hidden_size=48, intermediate_size=96, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, moe_intermediate_size=40, n_routed_experts=8,
        num_experts_per_tok=3, n_shared_experts=1))
    for name, dtype in DTYPES.items():
        for tokens in (1, 5, 70):
            moe = MoE(config).eval()
            with torch.no_grad():
                for p in moe.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
            moe = moe.to(dtype)
            x = torch.randn(tokens, 48, generator=gen).to(dtype)
            experts = torch.stack([torch.randperm(6, generator=gen)[:3] for _ in range(tokens)])  # 6, 7 unused
            weights = torch.rand(tokens, 3, generator=gen)
            kernels.MODE = "0"
            with torch.no_grad():
                expected = moe.routed(x, weights, experts).double()
                kernels.MODE = "interpret"
                before = moe_triton.CALLS["grouped"]
                got = moe.routed(x, weights, experts)
                calls = moe_triton.CALLS["grouped"] - before
                kernels.MODE = "0"
                after = moe.routed(x, weights, experts).double()  # the loop on the stacks' views
            out.append({"dtype": name, "tokens": tokens, "calls": calls, "out_dtype": str(got.dtype).removeprefix("torch."),
                        "error": (got.double() - expected).abs().max().item() / expected.abs().max().item(),
                        "views_error": (after - expected).abs().max().item()})
    return out


def latent_cases() -> list[dict]:
    out = []
    gen = torch.Generator().manual_seed(1)
    for heads, rank, rope in ((20, 64, 16), (8, 48, 8), (16, 128, 32), random_latent_shape()):
        for name, dtype in DTYPES.items():
            lengths = [1, 32, 33, 100]
            q = torch.randn(len(lengths), heads, rank + rope, generator=gen).to(dtype)
            pool = torch.randn(700, rank + rope, generator=gen).to(dtype)
            slots, lens = slot_lists(lengths, 700, gen)
            scale = 0.11
            got = kernels.latent_decode(q, pool, slots, lens, rank, scale)
            worst = 0.0
            for b, n in enumerate(lengths):
                rows = pool[slots[b, :n]].double()
                w = torch.softmax(q[b].double() @ rows.t() * scale, dim=-1)
                expected = w @ rows[:, :rank]
                worst = max(worst, (got[b].double() - expected).abs().max().item())
            tables, listed = block_tables(lengths, 16, 700, gen)
            paged = (kernels.latent_decode(q, pool, tables, lens, rank, scale, page=16)
                     - kernels.latent_decode(q, pool, listed, lens, rank, scale)).abs().max().item()
            out.append({"shape": [heads, rank, rope], "dtype": name, "error": worst, "paged_difference": paged,
                        "out_shape": list(got.shape)})
    return out




def engine_case(make_hf, kind: str, chunked: bool = False, blocks: int | None = None, graphs: bool = False) -> dict:
    """A tiny model through the serving engine, greedy: decode steps through the `kind` kernel
    against the same engine's torch path. `chunked`: steps of at most 24 tokens, so the longer
    prompts are prefilled in chunks beside the others' decode rows, and a prompt that repeats
    another's first 48 tokens starts from the prefix cache. `blocks`: a paged cache of that many
    blocks, too few for every sequence at once, so some are preempted and resumed. `graphs`:
    decode steps replayed from CUDA graphs as the engine captures them (emulated: the captured
    step run again on its static buffers, host reads refused), the requests of different lengths
    so the batch shrinks through the buckets; each replay's hidden states are compared with the
    same step made the ordinary way."""
    import tempfile

    from inference.config import ModelConfig
    from inference.engine import EngineArgs, LLMEngine, cuda_graphs
    from inference.layers.caches.layouts import cache_layout
    from inference.layers.kernels import moe_triton
    from inference.loader import load_model
    from inference.sampling_params import SamplingParams

    torch.manual_seed(0)
    hf = make_hf()
    with tempfile.TemporaryDirectory() as path:
        hf.save_pretrained(path)
        model = load_model(path, ModelConfig.from_pretrained(path), "cpu")
    vocab = model.config.vocab_size
    prompts = [[5, 6, 7, 8, 9], [t % (vocab - 3) + 3 for t in range(10, 80)], [3] * 20]
    if chunked:
        prompts.append(prompts[1][:48] + [4] * 9)
    lengths = [12, 9, 5, 3] if graphs else [12] * 4
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]

    kv_bytes = None
    if blocks is not None:
        kv_bytes = blocks * cache_layout(model.config).bytes_per_block(16, model.model.embed_tokens.weight.dtype)
    preemptions = []

    def run() -> list[list[int]]:
        args = EngineArgs(block_size=16, max_num_seqs=4, max_num_batched_tokens=24 if chunked else 8192,
                          kv_cache_bytes=kv_bytes)
        engine = LLMEngine(model, args=args, eos_token_ids=[])
        ids = [engine.add_request(p, params[i]) for i, p in enumerate(prompts)]
        replays.append(engine.runner.graphs.replays if engine.runner.graphs is not None else 0)
        done = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out.token_ids
        preemptions.append(engine.scheduler.num_preemptions)
        if engine.runner.graphs is not None:
            replays[-1] = engine.runner.graphs.replays - replays[-1]
        return [done[i] for i in ids]

    replays = []
    kernels.MODE = "0"
    reference = run()
    kernels.MODE = "interpret"
    cuda_graphs.MODE = "emulate" if graphs else "0"
    before, grouped = kernels.CALLS[kind], moe_triton.CALLS["grouped"]
    with compared_replays() if graphs else compared_layers() as worst:
        tokens = run()
    kernels.MODE = cuda_graphs.MODE = "0"
    return {"tokens": tokens, "reference": reference, "kernel_calls": kernels.CALLS[kind] - before,
            "worst_difference": worst[0], "moe_calls": moe_triton.CALLS["grouped"] - grouped,
            "preemptions": preemptions[-1], "replays": replays[-1], "buckets": sorted(worst[1])}


@contextlib.contextmanager
def compared_replays():
    """Every decode step replayed from a graph computed again the ordinary way (the runner's
    slot tables, `cache.step`; the cache writes are the same both times), the largest difference
    of the hidden states kept, and the bucket sizes replayed."""
    from inference.engine.cuda_graphs import DecodeGraphs
    from inference.layers.caches.paged_slots import SequenceSlots

    worst = [0.0, set()]
    replay = DecodeGraphs.run

    def both(self, batch):
        got = replay(self, batch).clone()
        worst[1].add(min(size for size in self.graphs if size >= len(batch)))
        slots = [SequenceSlots(seq, seq.num_computed_tokens, 1, torch.tensor(seq.block_table), self.block_size)
                 for seq, _ in batch]
        want = self.model(torch.tensor([seq.token_ids[-1] for seq, _ in batch]),
                          torch.tensor([seq.num_computed_tokens for seq, _ in batch]), self.cache.step(slots))
        worst[0] = max(worst[0], (got - want).abs().max().item())
        return got

    DecodeGraphs.run = both
    try:
        yield worst
    finally:
        DecodeGraphs.run = replay


@contextlib.contextmanager
def compared_layers():
    """Every decode step's attention computed twice, through the kernels and through the torch
    path (the cache writes are the same both times), the largest difference kept: tokens alone
    can hide a wrong context that happens not to change a greedy choice."""
    from inference.layers.caches.gqa import PagedGQALayer
    from inference.layers.dsa import DSAttention
    from inference.layers.mla import MLAttention

    worst = [0.0, set()]
    gqa, mla, dsa, selected = PagedGQALayer.attend, MLAttention.forward, DSAttention.forward, DSAttention._selected

    def gqa_both(self, q, k, v, norms, gate):
        plan = self.plan
        out = gqa(self, q, k, v, norms, gate)
        saved = plan.decode_table, plan.local_table, plan.prefill_plan
        if saved != (None, None, None):
            plan.decode_table = plan.local_table = plan.prefill_plan = None
            worst[0] = max(worst[0], (out - gqa(self, q, k, v, norms, gate)).abs().max().item())
            plan.decode_table, plan.local_table, plan.prefill_plan = saved
        return out

    def mla_both(self, x, rotations, cache):
        out = mla(self, x, rotations, cache)
        table = getattr(cache, "latent_table", None)
        if table is not None:
            cache.latent_table = None
            worst[0] = max(worst[0], (out - mla(self, x, rotations, cache)).abs().max().item())
            cache.latent_table = table
        return out

    def dsa_both(self, x, rotations, cache, chosen=None):
        out, mine = dsa(self, x, rotations, cache, chosen)
        if getattr(cache, "batched_decode", False):
            cache.batched_decode = False
            worst[0] = max(worst[0], (out - dsa(self, x, rotations, cache, chosen)[0]).abs().max().item())
            cache.batched_decode = True
        return out, mine

    def selected_both(self, query, latents, picked, positions, rows):
        out = selected(self, query, latents, picked, positions, rows)
        if kernels.wanted(query.device):  # a prefill's or a chunk's chosen rows
            kernels.MODE = "0"
            worst[0] = max(worst[0], (out - selected(self, query, latents, picked, positions, rows)).abs().max().item())
            kernels.MODE = "interpret"
        return out

    PagedGQALayer.attend, MLAttention.forward, DSAttention.forward = gqa_both, mla_both, dsa_both
    DSAttention._selected = selected_both
    try:
        yield worst
    finally:
        PagedGQALayer.attend, MLAttention.forward, DSAttention.forward = gqa, mla, dsa
        DSAttention._selected = selected


def glm4():
    from transformers import Glm4Config, Glm4ForCausalLM

    return Glm4ForCausalLM(Glm4Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      pad_token_id=0, eos_token_id=[1]))


def sparse(routed: bool):
    """A tiny glm5_sparse (window 16, a key node per 4): the window and the nodes, one softmax
    (union) or the router's mix of the two (routed)."""
    from tests.inference.helpers import glm5_config, write_checkpoint

    class Saved:  # what engine_case's save_pretrained expects
        def save_pretrained(self, path):
            write_checkpoint(Path(path), glm5_config(num_mtp_heads=0, routed=routed, vocab_size=300))

    return Saved()


def engines() -> dict:
    from tests.inference import test_glm4_moe_lite, test_glm_moe_dsa

    return {"glm4": engine_case(glm4, "gqa"),
            "glm4_prefill": engine_case(glm4, "gqa_prefill", chunked=True),
            "glm4_preempted": engine_case(glm4, "gqa_prefill", chunked=True, blocks=8),
            "glm5_sparse_union": engine_case(lambda: sparse(False), "gqa"),
            "glm5_sparse_routed": engine_case(lambda: sparse(True), "gqa"),
            "glm5_sparse_union_prefill": engine_case(lambda: sparse(False), "gqa_prefill", chunked=True),
            "glm5_sparse_routed_prefill": engine_case(lambda: sparse(True), "gqa_prefill", chunked=True),
            "glm5_sparse_routed_preempted": engine_case(lambda: sparse(True), "gqa_prefill", chunked=True,
                                                        blocks=5),
            "glm4_moe_lite": engine_case(test_glm4_moe_lite.make_hf, "latent"),
            "glm4_moe_lite_prefill": engine_case(test_glm4_moe_lite.make_hf, "latent", chunked=True),
            "glm_moe_dsa": engine_case(test_glm_moe_dsa.make_hf, "latent"),
            "glm_moe_dsa_prefill": engine_case(test_glm_moe_dsa.make_hf, "latent", chunked=True),
            "glm4_graphs": engine_case(glm4, "gqa", graphs=True),
            "glm4_graphs_preempted": engine_case(glm4, "gqa", chunked=True, blocks=6, graphs=True),
            "glm4_moe_lite_graphs": engine_case(test_glm4_moe_lite.make_hf, "latent", graphs=True)}


if __name__ == "__main__":
    print(json.dumps({"gqa": gqa_cases(), "gqa_prefill": gqa_prefill_cases(), "latent": latent_cases(),
                      "moe": moe_cases(), "engines": engines()}))
