"""Batched MTP speculative decoding in the serving engine: greedy gives exactly the plain greedy
tokens for every k, in batches that mix k and plain requests; limits are honoured exactly; the
cache keeps (and the prefix cache keys) only accepted positions; sampling keeps the model's
distribution.

Most tests run the shipped demo model, whose MTP heads are trained (about 4.6 tokens per verify
at k=4), so that drafts are accepted, partly accepted and rejected; the tiny random model (W=16,
G=4) adds ring and node rollback on a window that generations cross many times.
"""

import math

import pytest
import torch

from demo.corpus import load_qa
from inference.config import ModelConfig
from inference.engine import EngineArgs, LLMEngine
from inference.engine.block_manager import chain_hash
from inference.layers.caches.layouts import cache_layout
from inference.layers.sampler import Sampler
from inference.loader import load_model
from inference.sampling_params import SamplingParams
from inference.tokenizer import ChatTokenizer
from tests.demo.test_demo_model import DEMO
from tests.inference.engine.conftest import engine_for, random_prompts, reference
from tests.inference.helpers import reference_tokens
from tests.inference.test_kv_cache import build
from worker.observability.metrics import SpeculativeCollector

pytestmark = pytest.mark.skipif(not (DEMO / "model.safetensors").exists(), reason="no models/demo")
GREEDY = SamplingParams(temperature=0, max_tokens=40)
PROMPT_INDEX = 5


def demo_model(**overrides):
    config = ModelConfig.from_pretrained(DEMO, dtype="float32", **overrides)
    return load_model(DEMO, config, "cpu")


@pytest.fixture(scope="module")
def demo():
    """The demo model (W=512, G=64) and its tokenizer."""
    return demo_model(), ChatTokenizer.from_pretrained(DEMO)


@pytest.fixture(scope="module")
def small_window():
    """The demo model with W=64, G=16, so that conversations cross the window."""
    return demo_model(sliding_window=64, global_interval=16), ChatTokenizer.from_pretrained(DEMO)


def conversations(tokenizer, count: int, seed: int = 0) -> list[list[int]]:
    """Chat prompts from 1 to 5 turns (about 15 to 200 tokens): lengths across intervals and blocks."""
    qa = load_qa()
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for i in range(count):
        turns = 1 + i % 5
        picks = torch.randint(0, len(qa), (turns,), generator=g).tolist()
        messages = []
        for j in picks[:-1]:
            messages += [{"role": "user", "content": qa[j]["question"]},
                         {"role": "assistant", "content": qa[j]["answer"]}]
        messages.append({"role": "user", "content": qa[picks[-1]]["question"]})
        prompts.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    return prompts


def engine(model, tokenizer, **kwargs) -> LLMEngine:
    per_block = cache_layout(model.config).bytes_per_block(kwargs.get("block_size", 64), torch.float32)
    args = EngineArgs(kv_cache_bytes=kwargs.pop("num_blocks", 96) * per_block, **kwargs)
    return LLMEngine(model, tokenizer, args, model.config.eos_token_ids)


def plain(model, tokenizer, prompts, params=GREEDY) -> list[list[int]]:
    """Each prompt decoded alone on the model's one-sequence cache, ending at an eos."""
    return [reference_tokens(model, p, params, model.config.eos_token_ids) for p in prompts]


def check_cache(engine: LLMEngine) -> None:
    """Every running sequence holds blocks for its kept positions only, and every key it put in
    the prefix cache hashes kept tokens."""
    manager, b = engine.block_manager, engine.block_manager.block_size
    for seq in engine.scheduler.running:
        assert len(seq.block_table) == -(-seq.num_computed_tokens // b)
        assert seq.num_keyed_blocks <= seq.num_computed_tokens // b
        previous = None
        for i in range(seq.num_keyed_blocks):
            previous = chain_hash(previous, seq.token_ids[i * b : (i + 1) * b])
            assert seq.block_hashes[i] == previous
            if seq.block_table[i] >= 0:
                assert manager.blocks.block_hash[seq.block_table[i]] == previous
        for block in seq.block_table[seq.num_keyed_blocks :]:
            assert manager.blocks.block_hash[block] is None  # a partial block is never keyed


def run_checked(engine: LLMEngine, prompts, params, ks) -> list:
    ids = [engine.add_request(p, params, speculative_k=k) for p, k in zip(prompts, ks, strict=True)]
    final, streamed = {}, {i: [] for i in ids}
    while engine.has_unfinished_requests():
        for out in engine.step():
            streamed[out.request_id] += out.new_token_ids
            if out.finished:
                final[out.request_id] = out
        check_cache(engine)
    assert all(streamed[i] == final[i].token_ids for i in ids)
    assert engine.block_manager.all_free() and not engine.requests
    return [final[i] for i in ids]


@pytest.mark.parametrize("k", range(1, 9))
def test_batched_greedy_equals_plain_greedy_for_every_k(demo, k):
    model, tokenizer = demo
    prompts = conversations(tokenizer, 10, seed=k)
    # k for most, plain for some, another k beside: one batch, chunked prefill (64 tokens a step)
    ks = [k, 0, k, 1 + (k % 8), k, 0, k, k, 8, k]
    eng = engine(model, tokenizer, max_num_batched_tokens=160)
    outputs = run_checked(eng, prompts, GREEDY, ks)
    assert [o.token_ids for o in outputs] == plain(model, tokenizer, prompts)
    stats = eng.speculative_stats
    assert stats.rounds and stats.proposed[k - 1] and stats.accepted[0]
    assert 1.0 < stats.mean_accepted_length <= 9.0


def test_single_requests_and_prefix_cache_hits(demo):
    model, tokenizer = demo
    qa = load_qa()
    system = [{"role": "system", "content": " ".join(item["answer"] for item in qa[:4])}]
    prompts = [tokenizer.apply_chat_template(system + [{"role": "user", "content": item["question"]}],
                                             add_generation_prompt=True) for item in qa[10:14]]
    assert min(map(len, prompts)) > 128
    expected = plain(model, tokenizer, prompts)
    eng = engine(model, tokenizer)
    for prompt, tokens in zip(prompts, expected, strict=True):  # one at a time
        assert run_checked(eng, [prompt], GREEDY, [4])[0].token_ids == tokens
    outputs = run_checked(eng, prompts, GREEDY, [3, 4, 0, 6])  # again, batched: prefix hits
    assert all(o.cached_tokens >= 64 for o in outputs)
    assert [o.token_ids for o in outputs] == expected


def test_generations_across_the_window(small_window):
    model, tokenizer = small_window
    prompts = conversations(tokenizer, 6, seed=11)
    params = SamplingParams(temperature=0, max_tokens=90, ignore_eos=True)
    outputs = run_checked(engine(model, tokenizer, max_num_batched_tokens=128), prompts, params,
                          [4, 8, 0, 2, 5, 3])
    assert [o.token_ids for o in outputs] == plain(model, tokenizer, prompts, params)
    assert all(o.completion_tokens == 90 for o in outputs)


def test_random_model_small_window_and_preemption():
    """W=16, G=4, 2 MTP heads (k > 2 runs the last head on): rollbacks in the ring and the node
    pages many times over, block size 4, and a cache small enough to preempt."""
    torch.manual_seed(0)
    model = build(num_mtp_heads=2)
    model.lm_head.weight.data *= 8  # no near-ties between a 1-row and a k-row forward
    prompts = random_prompts(8, 1, 70, seed=3)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    expected = reference(model, prompts, params)
    for ks, blocks in (([1, 2, 3, 8, 0, 5, 6, 7], 64), ([4] * 8, 9)):
        eng = engine_for(model, num_blocks=blocks, block_size=4, max_num_batched_tokens=48)
        assert [o.token_ids for o in run_checked(eng, prompts, params, ks)] == expected
    assert eng.scheduler.num_preemptions > 0


def test_max_tokens_and_eos_are_exact(demo):
    model, tokenizer = demo
    prompts = conversations(tokenizer, 8, seed=21)
    long = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    expected = plain(model, tokenizer, prompts, long)
    for n in (1, 2, 3, 5, 9):
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        outputs = run_checked(engine(model, tokenizer), prompts, params, [8, 4, 2, 1, 8, 3, 0, 6])
        assert [o.token_ids for o in outputs] == [t[:n] for t in expected]
        assert all(o.finish_reason == "length" for o in outputs)
    # EOS inside accepted drafts: the request ends at it, the drafts after it are dropped
    eng = engine(model, tokenizer)
    eng.eos_token_ids = {expected[0][6]}
    outputs = run_checked(eng, prompts, SamplingParams(temperature=0, max_tokens=30), [8] * 8)
    for out, tokens in zip(outputs, expected, strict=True):
        cut = next((i for i, t in enumerate(tokens) if t in eng.eos_token_ids), None)
        assert out.token_ids == (tokens if cut is None else tokens[: cut + 1])
        assert out.finish_reason == ("length" if cut is None else "stop")
    assert eng.speculative_stats.accepted[5] > 0  # drafts past the stop were accepted, then dropped


def test_stop_strings_match_plain_decoding(demo):
    model, tokenizer = demo
    prompts = conversations(tokenizer, 4, seed=31)
    texts = [tokenizer.decode(t) for t in plain(model, tokenizer, prompts)]
    params = SamplingParams(temperature=0, max_tokens=40, stop=[texts[0][4:6]])
    plain_out = run_checked(engine(model, tokenizer), prompts, params, [0] * 4)
    spec_out = run_checked(engine(model, tokenizer), prompts, params, [8, 4, 6, 2])
    assert [(o.text, o.token_ids, o.finish_reason) for o in spec_out] == \
        [(o.text, o.token_ids, o.finish_reason) for o in plain_out]
    assert spec_out[0].finish_reason == "stop"


def test_rejection_sampling_keeps_the_model_distribution_batched(demo):
    """Like the single-request test, on the real path: many seeded requests in batches, k=1:
    the second token comes from the verify round (an accepted draft or a residual draw), so the
    joint distribution of the first two tokens must be the model's own p(t1) p(t2 | t1). The
    prompt is one cached block plus one token, so that each request costs about a decode step."""
    model, tokenizer = demo
    # a place where the drafts' q is far from p (total variation 0.3 to 0.5), so that a wrong
    # acceptance rule shows
    prompt = [p for p in conversations(tokenizer, 40, seed=61) if len(p) > 70][PROMPT_INDEX][:65]
    base = dict(temperature=1.5, top_k=2, max_tokens=3, ignore_eos=True)
    sampler, exact = Sampler(), {}

    def last_logits(ids):
        return model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), model.new_cache())[-1:])

    with torch.inference_mode():
        first = sampler.probs(last_logits(prompt), [SamplingParams(**base)], [prompt])[0]
        for t1 in first.nonzero().squeeze(1).tolist():
            ids = prompt + [t1]
            second = sampler.probs(last_logits(ids), [SamplingParams(**base)], [ids])[0]
            for t2 in second.nonzero().squeeze(1).tolist():
                exact[t1, t2] = float(first[t1] * second[t2])
    trials, batch, counts = 1600, 400, {}
    eng = engine(model, tokenizer, num_blocks=2 * batch + 8, max_num_seqs=batch)
    eng.generate([prompt], SamplingParams(**base))  # puts the first block in the prefix cache
    for a in range(0, trials, batch):
        params = [SamplingParams(seed=s, **base) for s in range(a, a + batch)]
        for out in eng.generate([prompt] * batch, params, speculative_k=1):
            assert out.cached_tokens == 64
            key = tuple(out.token_ids[:2])
            counts[key] = counts.get(key, 0) + 1
    stats = eng.speculative_stats
    assert 0 < stats.accepted[0] < stats.proposed[0]  # both ways of making the second token
    assert set(counts) <= set(exact)
    for key, p in exact.items():
        sigma = math.sqrt(p * (1 - p) / trials)
        assert abs(counts.get(key, 0) / trials - p) < 4 * sigma + 1e-3, (key, counts.get(key, 0) / trials, p)


def test_seeded_speculative_sampling_is_batch_independent(demo):
    model, tokenizer = demo
    prompts = conversations(tokenizer, 4, seed=41)
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=20, seed=3)
    alone = [run_checked(engine(model, tokenizer), [p], params, [4])[0].token_ids for p in prompts]
    batched = [o.token_ids for o in run_checked(engine(model, tokenizer), prompts, params, [4] * 4)]
    assert batched == alone


def test_stats_reach_the_worker_metrics_and_bad_k_is_refused(demo):
    model, tokenizer = demo
    eng = engine(model, tokenizer, speculative_k=3)  # the engine-wide default
    run_checked(eng, conversations(tokenizer, 3, seed=51), GREEDY, [None, None, 5])
    stats = eng.speculative_stats
    assert stats.proposed[2] > 0 and stats.proposed[4] > 0
    collector = SpeculativeCollector(lambda: [eng.speculative_stats])
    from tests.inference.engine.test_engine_metrics import scrape

    values = scrape(collector)
    for i in range(stats.k):
        assert values[f'wecom_bot_speculative_proposed_total{{position="{i}"}}'] == stats.proposed[i]
        assert values[f'wecom_bot_speculative_accepted_total{{position="{i}"}}'] == stats.accepted[i]
    assert values["wecom_bot_speculative_accepted_length_count"] == stats.rounds
    with pytest.raises(ValueError, match="0..8"):
        eng.add_request([5, 6], speculative_k=9)
    with pytest.raises(ValueError, match="0..8"):
        EngineArgs(speculative_k=-1)
    no_mtp = build(num_mtp_heads=0)
    with pytest.raises(ValueError, match="MTP heads"):
        engine_for(no_mtp).add_request([5, 6], speculative_k=2)


def test_greedy_with_repetition_penalty_and_aborts(demo):
    """Greedy with a penalty takes the general (non plain-greedy) draft and verify path: still
    the plain tokens. An aborted speculative request gives its blocks back at once."""
    model, tokenizer = demo
    prompts = conversations(tokenizer, 4, seed=71)
    params = SamplingParams(temperature=0, repetition_penalty=1.3, max_tokens=30)
    outputs = run_checked(engine(model, tokenizer), prompts, params, [4, 2, 0, 8])
    assert [o.token_ids for o in outputs] == plain(model, tokenizer, prompts, params)
    eng = engine(model, tokenizer)
    ids = [eng.add_request(p, GREEDY, speculative_k=4) for p in prompts]
    for _ in range(3):
        eng.step()
    for request_id in ids:
        eng.abort_request(request_id)
    assert not eng.has_unfinished_requests() and eng.block_manager.all_free()


def test_worker_engine_takes_k_from_settings(tmp_path, caplog):
    """ENGINE_SPECULATIVE_K reaches the worker's engine; a checkpoint without MTP heads is refused
    with a clear, non-transient error; a CPU engine says at start which CPU kernels it has."""
    from types import SimpleNamespace

    from app.llm import LLMError
    from app.llm.engine_backend import EngineBackend
    from tests.inference.helpers import glm5_config, write_checkpoint

    def settings(path, k):
        return SimpleNamespace(model_dir=str(path), engine_max_num_seqs=4, engine_max_model_len=None,
                               engine_kv_cache_bytes=1 << 22, engine_speculative_k=k)

    caplog.set_level("INFO", logger="app.llm.engine_backend")
    backend = EngineBackend.from_settings(settings(write_checkpoint(tmp_path / "mtp", glm5_config()), 3))
    try:
        assert backend.service.engine.args.speculative_k == 3
        assert "engine: CPU kernels" in caplog.text
    finally:
        backend.close()
    with pytest.raises(LLMError, match="MTP heads") as failure:
        EngineBackend.from_settings(settings(write_checkpoint(tmp_path / "no", glm5_config(num_mtp_heads=0)), 3))
    assert not failure.value.transient


def test_mtp_caches_are_bounded_and_a_worked_out_budget_sets_them_aside(monkeypatch):
    """Per speculative sequence the MTP caches never allocate past what `max_model_len` needs,
    and on the CPU default budget the paged cache gets the rest."""
    from inference.engine import llm_engine
    from inference.layers.caches.gqa_sequence import cache_slots

    model = build(max_position_embeddings=300, num_mtp_heads=2)  # W=16, G=4, 2 kv heads x 8
    layout = cache_layout(model.config)
    per_block = layout.bytes_per_block(64, torch.float32)
    monkeypatch.setattr(llm_engine, "CPU_KV_CACHE_BYTES", 64 * per_block)
    engine = LLMEngine(model, args=EngineArgs(max_num_seqs=3, speculative_k=4), eos_token_ids=[])
    one = layout.layer_cache_bytes(torch.float32, engine.mtp_positions)
    assert engine.mtp_positions == 300 + 9 and engine.mtp_cache_bytes == 3 * 2 * one
    assert engine.block_manager.blocks.num_free == (64 * per_block - engine.mtp_cache_bytes) // per_block

    params = SamplingParams(temperature=0, max_tokens=270, ignore_eos=True)
    for prompt in random_prompts(3, 10, 25):
        engine.add_request(prompt, params)
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        for seq in engine.requests.values():
            if seq.drafts is not None:
                caches = [layer for layer in seq.drafts.drafter.cache.layers if layer is not None]
                peak = max(peak, max(layer.nbytes() for layer in caches))
    # past 64 nodes the caches grew (from W + 64 slots), but only up to what 309 positions need
    bound = 2 * cache_slots(16, 4, engine.mtp_positions) * 2 * 8 * 4
    assert 2 * (16 + 64) * 2 * 8 * 4 < peak == bound < one


def test_mtp_caches_leave_nothing_of_a_small_worked_out_budget_is_a_clear_error(monkeypatch):
    from inference.engine import llm_engine

    model = build(num_mtp_heads=1)
    monkeypatch.setattr(llm_engine, "CPU_KV_CACHE_BYTES", 1000)
    with pytest.raises(ValueError, match="MTP caches of 64 sequences"):
        LLMEngine(model, args=EngineArgs(), eos_token_ids=[])
