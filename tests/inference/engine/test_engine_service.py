"""The worker's engine service batches concurrent callers; the backend maps engine errors."""

import threading

import pytest
import torch

from app.llm import GenerationParams, LLMError
from app.llm.engine_backend import TOO_LONG, EngineBackend
from inference.engine.service import EngineService
from inference.sampling_params import SamplingParams
from tests.inference.engine.conftest import GREEDY, engine_for, random_prompts, reference


@pytest.fixture
def service(model):
    engine = engine_for(model, max_model_len=200)
    svc = EngineService(engine)
    yield svc
    svc.close()
    assert not svc._thread.is_alive()


def test_concurrent_submits_share_batches(model, service):
    prompts = random_prompts(8, 5, 60, seed=20)
    sizes = []
    run = service.engine.runner.run
    service.engine.runner.run = lambda batch: sizes.append(len(batch)) or run(batch)
    results = [None] * len(prompts)
    barrier = threading.Barrier(len(prompts))

    def chat(i):
        barrier.wait()
        results[i] = service.submit(prompts[i], GREEDY).result().token_ids

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == reference(model, prompts)
    assert max(sizes) > 1
    assert service.engine.block_manager.all_free()


def test_streaming_and_abandoning_a_stream(service):
    stream = service.submit(random_prompts(1, 10, 11)[0], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    for n, out in enumerate(stream, 1):
        assert out.new_token_ids
        if n == 3:
            break  # the caller hung up: the request is aborted
    done = service.submit([5, 6, 7], GREEDY).result()  # the engine goes on
    assert done.completion_tokens == GREEDY.max_tokens
    assert service.engine.block_manager.all_free() and not service.engine.requests


def test_backend_maps_errors_to_llm_errors(service, monkeypatch):
    backend = EngineBackend(service, "tiny")
    params = GenerationParams(max_tokens=5, temperature=0)
    ok = backend.generate([5, 6, 7, 8], params)
    assert ok.completion_tokens == 5 and ok.prompt_tokens == 4 and ok.model == "tiny"
    with pytest.raises(LLMError) as too_long:
        backend.generate(list(range(3, 250)), params)
    assert str(too_long.value) == TOO_LONG and too_long.value.status == 400 and not too_long.value.transient
    run = service.engine.runner.run

    def oom(batch):
        raise torch.OutOfMemoryError("injected")

    monkeypatch.setattr(service.engine.runner, "run", oom)
    with pytest.raises(LLMError) as failed:
        backend.generate([5, 6, 7, 8], params)
    assert failed.value.status == 503 and failed.value.transient
    monkeypatch.setattr(service.engine.runner, "run", run)
    assert backend.generate([5, 6, 7, 8], params).completion_tokens == 5
    assert service.engine.block_manager.all_free()
