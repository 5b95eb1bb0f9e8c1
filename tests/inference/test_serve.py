"""`python -m inference serve`: the OpenAI-compatible server over one serving engine (the
bundled demo model), through Flask's test client and, once, as the real process that the
worker's OpenAI backend talks to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from app.knowledge.embeddings import EmbeddingClient
from app.llm import GenerationParams, OpenAIBackend
from inference.embedder import Embedder
from inference.engine import EngineArgs, LLMEngine
from inference.engine.sequence import TextOut
from inference.engine.service import EngineService
from inference.sampling_params import SamplingParams
from inference.server.serve import create_app
from tests.inference.helpers import reference_tokens
from tests.support.stack import free_port

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"
EMBEDDER = DEMO.parent / "demo-embed"
QUESTION = [{"role": "user", "content": "年假有几天？"}]


@pytest.fixture(scope="module")
def service():
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(DEMO), max_num_seqs=8, max_model_len=512))
    svc = EngineService(engine)
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def client(service):
    return create_app(service, "demo", default_max_tokens=24).test_client()


def events(response) -> list:
    lines = [line for line in response.get_data(as_text=True).split("\n\n") if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_models_and_health(client):
    assert client.get("/v1/models").get_json()["data"][0]["id"] == "demo"
    assert client.get("/health").get_json() == {"status": "ok", "model": "demo"}
    metrics = client.get("/metrics").get_data(as_text=True)
    assert "inference_requests_in_engine" in metrics


def test_a_completion_is_the_engine_greedy_answer_with_its_usage(client, service):
    body = {"model": "demo", "messages": QUESTION, "temperature": 0, "max_tokens": 24}
    answer = client.post("/v1/chat/completions", json=body).get_json()
    engine = service.engine
    expected = reference_tokens(engine.model, engine.prompt_ids(QUESTION), SamplingParams(temperature=0, max_tokens=24),
                                engine.eos_token_ids)
    out = TextOut(engine.tokenizer, [])  # the text of the tokens, as the engine renders them
    text = "".join(out.push(t) for t in expected if t not in engine.eos_token_ids) + out.flush()
    choice = answer["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": text} and text
    assert choice["finish_reason"] in ("stop", "length")
    usage = answer["usage"]
    assert usage["completion_tokens"] == len(expected)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 3
    long = {**body, "messages": [{"role": "system", "content": "你是公司的员工助手。" * 30}, *QUESTION]}
    assert client.post("/v1/chat/completions", json=long).get_json()["usage"]["prompt_tokens"] > 128
    again = client.post("/v1/chat/completions", json=long).get_json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 64  # the prefix cache's blocks
    assert 'inference_requests_total{outcome="ok"}' in client.get("/metrics").get_data(as_text=True)


def test_the_stream_carries_the_same_text_then_usage(client):
    body = {"messages": QUESTION, "temperature": 0, "max_tokens": 24}
    whole = client.post("/v1/chat/completions", json=body).get_json()
    chunks = events(client.post("/v1/chat/completions", json={**body, "stream": True,
                                                               "stream_options": {"include_usage": True}}))
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == \
        whole["usage"]["completion_tokens"]


@pytest.mark.parametrize("body, status, says", [
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
    ({"messages": QUESTION, "temperature": 5}, 400, "temperature"),
    ({"messages": QUESTION, "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "text parts"),
    ({"messages": QUESTION, "model": "gpt-4"}, 404, "does not exist"),
    ({"messages": [{"role": "user", "content": "年假" * 2000}]}, 400, "max_model_len"),
    ([1, 2], 400, "JSON object"),
    ({"messages": QUESTION, "guided_choice": ["a", ""]}, 400, "guided_choice"),
    ({"messages": QUESTION, "guided_choice": []}, 400, "guided_choice"),
    ({"messages": QUESTION, "guided_choice": ["a"], "choice_scoring": "best"}, 400, "choice_scoring"),
    ({"messages": QUESTION, "guided_choice": ["a", "b"], "choice_scoring": "likelihood", "choice_bias": [1]}, 400,
     "choice_bias"),
])
def test_a_bad_request_gets_a_4xx_in_openais_shape(client, body, status, says):
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == status
    error = response.get_json()["error"]
    assert says in error["message"] and error["type"]
    if says == "max_model_len":
        assert error["code"] == "context_length_exceeded"


def test_hostile_bodies_get_400_not_500(client):
    assert client.post("/v1/chat/completions", data=b"{not json").status_code == 400
    nested = b"[" * 100_000 + b"]" * 100_000
    assert client.post("/v1/chat/completions", data=nested).status_code == 400
    assert client.post("/v1/chat/completions", data=b"x" * (5 * 1024 * 1024)).status_code == 413
    assert client.get("/v1/chat/completions").status_code == 405


def test_an_api_key_is_required_when_set(service):
    client = create_app(service, "demo", api_key="k-" + "x" * 30).test_client()
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer k-" + "x" * 30}).status_code == 200
    assert client.get("/health").status_code == 200  # probes need no key


def test_concurrent_requests_share_engine_steps(client, service):
    body = {"messages": QUESTION, "temperature": 0.7, "max_tokens": 24, "seed": 1}
    before = service.max_batch
    service.max_batch = 0
    results = []
    threads = [threading.Thread(target=lambda: results.append(client.post("/v1/chat/completions", json=body)))
               for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in results] == [200] * 6
    assert service.max_batch >= 2  # some step advanced several requests at once
    service.max_batch = max(before, service.max_batch)


def test_the_served_process_answers_the_workers_openai_backend():
    port = free_port()
    env = {**os.environ, "INFERENCE_API_KEY": "serve-test-key-" + "z" * 20}
    server = subprocess.Popen([sys.executable, "-m", "inference", "serve", "--model", str(DEMO), "--port", str(port),
                               "--max-num-seqs", "4", "--max-model-len", "512", "--embeddings", str(EMBEDDER)],
                              env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):  # listening while the model loads
                assert server.poll() is None, server.stdout.read().decode()
                time.sleep(0.3)
        backend = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "demo", api_key=env["INFERENCE_API_KEY"],
                                reply_start="answer")
        params = GenerationParams(temperature=0, max_tokens=24)
        whole = backend.generate(QUESTION, params)
        streamed = list(backend.stream(QUESTION, params))
        assert whole.text and "".join(d.text for d in streamed) == whole.text == streamed[-1].final.text
        assert whole.completion_tokens == streamed[-1].final.completion_tokens > 0
        assert whole.prompt_tokens > 3
        choice = ("请联系 IT 服务台。", "Sorry, I could not find this in the knowledge base.")
        chosen = backend.generate(QUESTION, GenerationParams(temperature=0, max_tokens=200, choice=choice))
        assert chosen.text.strip() in choice  # guided_choice, as vLLM takes it
        for lifted in range(2):  # scored whole, and a bias large enough picks the reply it lifts
            bias = tuple(100.0 if i == lifted else 0.0 for i in range(2))
            chosen = backend.generate(QUESTION, GenerationParams(temperature=0, max_tokens=200, choice=choice,
                                                                 choice_scoring="likelihood", choice_bias=bias))
            assert chosen.text.strip() == choice[lifted]
        # the knowledge base's dense retrieval reaches the demo's embedder on the same server
        texts = ["年假有几天？", "How do I reset my VPN password?"]
        vectors = EmbeddingClient(f"http://127.0.0.1:{port}/v1", "demo-embed",
                                  api_key=env["INFERENCE_API_KEY"]).embed(texts)
        assert np.allclose(np.stack(vectors), Embedder.load(EMBEDDER).embed(texts).numpy(), atol=1e-6)
        listed = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=5,
                              headers={"Authorization": f"Bearer {env['INFERENCE_API_KEY']}"}).json()
        assert [m["id"] for m in listed["data"]] == ["demo", "demo-embed"]
    finally:
        server.terminate()
        server.wait(30)
