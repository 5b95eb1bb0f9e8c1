"""The engine gives the single-request numbers in every way it batches, caches and schedules."""

import pytest
import torch

from inference.engine import EngineArgs, LLMEngine, PromptTooLongError, RequestFailedError
from inference.sampling_params import SamplingParams
from tests.inference.engine.conftest import GREEDY, engine_for, random_prompts, reference
from tests.inference.test_kv_cache import build


@pytest.mark.parametrize("block_size", [64, 128])
def test_batched_equals_single_request(model, block_size):
    # lengths cross windows (16) and intervals (4) and blocks, with chunked prefill (40 tokens/step)
    prompts = random_prompts(6, 3, 150)
    engine = engine_for(model, block_size=block_size, max_num_batched_tokens=40)
    outputs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outputs] == reference(model, prompts)
    assert all(o.finish_reason == "length" and o.prompt_tokens == len(p) for o, p in zip(outputs, prompts))
    assert engine.block_manager.all_free()


def test_dense_glm4_batched_equals_single_request():
    model = build(model_type="glm4", sliding_window=None, global_interval=None, num_mtp_heads=0)
    assert not model.config.sparse
    prompts = random_prompts(4, 3, 90, seed=2)
    engine = engine_for(model, max_num_batched_tokens=32)
    assert [o.token_ids for o in engine.generate(prompts, GREEDY)] == reference(model, prompts)


def test_prefix_cache_hit_gives_the_same_tokens(model):
    system = random_prompts(1, 140, 141, seed=3)[0]
    prompts = [system + tail for tail in random_prompts(3, 1, 30, seed=4)]
    engine = engine_for(model)
    first = engine.generate(prompts[:1], GREEDY)[0]
    assert first.cached_tokens == 0
    outputs = engine.generate(prompts, GREEDY)
    assert [o.cached_tokens for o in outputs] == [128, 128, 128]  # two full blocks of 64
    assert [o.token_ids for o in outputs] == reference(model, prompts)
    off = engine_for(model, enable_prefix_caching=False)
    assert [o.token_ids for o in off.generate(prompts, GREEDY)] == [o.token_ids for o in outputs]
    assert all(o.cached_tokens == 0 for o in off.generate(prompts, GREEDY))
    assert engine.block_manager.all_free()


def test_whole_prompt_cached_still_computes_its_last_token(model):
    prompt = random_prompts(1, 128, 129, seed=5)[0]
    engine = engine_for(model)
    a, b = engine.generate([prompt, prompt], GREEDY)
    c = engine.generate([prompt], GREEDY)[0]
    assert a.token_ids == b.token_ids == c.token_ids == reference(model, [prompt])[0]
    assert c.cached_tokens == 64  # the last token is left to compute


def test_preempted_sequences_resume_with_the_same_tokens(model):
    prompts = random_prompts(8, 20, 120, seed=6)
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    engine = engine_for(model, num_blocks=6, max_num_batched_tokens=64)
    outputs = engine.generate(prompts, params)
    assert engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outputs] == reference(model, prompts, params)
    assert engine.block_manager.all_free()


def test_200_requests_through_a_small_cache_all_finish(model):
    g = torch.Generator().manual_seed(7)
    prompts = random_prompts(200, 1, 100, seed=8)
    params = [SamplingParams(temperature=0, max_tokens=int(n), ignore_eos=True)
              for n in torch.randint(1, 20, (200,), generator=g)]
    engine = engine_for(model, num_blocks=8, max_num_seqs=16, max_num_batched_tokens=128)
    outputs = engine.generate(prompts, params)
    assert [o.completion_tokens for o in outputs] == [p.max_tokens for p in params]
    assert engine.block_manager.all_free() and not engine.requests


def test_slid_out_blocks_are_freed_and_nodes_kept(model):
    engine = engine_for(model, max_num_batched_tokens=64)
    engine.add_request(random_prompts(1, 300, 301, seed=9)[0], GREEDY)
    while engine.scheduler.waiting or engine.scheduler.running[0].num_computed_tokens < 300:
        engine.step()
    seq = engine.scheduler.running[0]
    # window of 16 at position 300: only block 4 (256..319) is held; all 5 node pages are
    assert seq.block_table[:4] == [-1] * 4 and seq.block_table[4] >= 0
    assert len(seq.node_table) == 5
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.block_manager.all_free()


def test_streaming_and_stop_and_eos(model):
    engine = LLMEngine(model, args=EngineArgs(kv_cache_bytes=1 << 22), eos_token_ids=[])
    prompt = random_prompts(1, 10, 11, seed=10)[0]
    expected = reference(model, [prompt])[0]
    engine.eos_token_ids = {expected[5]}
    rid = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=24))
    seen = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == rid
            seen.extend(out.new_token_ids)
    assert seen == expected[: expected.index(expected[5]) + 1]
    assert out.finished and out.finish_reason == "stop"


def test_seeded_sampling_is_batch_independent(model):
    prompts = random_prompts(4, 5, 60, seed=11)
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=12, seed=3, ignore_eos=True)
    alone = [engine_for(model).generate([p], params)[0].token_ids for p in prompts]
    batched = [o.token_ids for o in engine_for(model).generate(prompts, params)]
    assert batched == alone


def test_prompt_over_max_model_len_is_a_clear_error(model):
    engine = engine_for(model, max_model_len=100)
    with pytest.raises(PromptTooLongError, match="max_model_len 100"):
        engine.add_request(list(range(3, 103)))
    with pytest.raises(ValueError, match="does not fit"):
        engine_for(model, num_blocks=2, max_model_len=10**9)
    out = engine.generate([list(range(3, 90))], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))[0]
    assert out.finish_reason == "length" and out.completion_tokens == 100 - 87


def test_out_of_memory_fails_that_request_and_the_engine_goes_on(model, monkeypatch):
    prompts = random_prompts(3, 10, 60, seed=12)
    engine = engine_for(model)
    run = engine.runner.run
    calls = {"n": 0}

    def flaky(batch):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError("injected")
        return run(batch)

    monkeypatch.setattr(engine.runner, "run", flaky)
    long_one = prompts[1] + list(range(3, 100))  # the biggest chunk when the failure hits
    ids = [engine.add_request(p, GREEDY) for p in (prompts[0], long_one, prompts[2])]
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    failed = [o for o in final.values() if o.finish_reason == "error"]
    assert len(failed) == 1 and isinstance(failed[0].error, RequestFailedError)
    ok = [final[i].token_ids for i in ids if final[i].finish_reason != "error"]
    expected = [t for p, t in zip((prompts[0], long_one, prompts[2]),
                                  reference(model, [prompts[0], long_one, prompts[2]]), strict=True)
                if final[ids[[prompts[0], long_one, prompts[2]].index(p)]].finish_reason != "error"]
    assert ok == expected and len(ok) == 2
    assert engine.block_manager.all_free()
