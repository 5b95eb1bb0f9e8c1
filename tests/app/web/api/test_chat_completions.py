"""The /v1 API through gunicorn, driven by the official ``openai`` client."""

from __future__ import annotations

import time

import openai
import pytest
import requests
from sqlalchemy import select

from app.accounting import set_budget, set_price
from app.models import AuditEvent, UsageRecord
from tests.support.api_server import MODEL
from tests.support.openai_server import THINKING

HELLO = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "你好 API"}]


def _usage_rows(api, name):
    with api.db.session() as session:
        return list(session.scalars(select(UsageRecord).where(UsageRecord.api_key_id == name)))


def _audit_events(api, name):
    with api.db.session() as session:
        return list(session.scalars(select(AuditEvent).where(
            AuditEvent.actor == f"api_key:{name}").order_by(AuditEvent.seq)))


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_completion_answers_and_records_usage_and_audit(api, key, client):
    name, _ = key
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=50)
    assert reply.choices[0].message.content == "答复#1: 你好 API"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    [usage] = _usage_rows(api, name)
    assert usage.user_hash == f"api_key:{name}"
    # charged the larger of the server's count (characters) and the answer's UTF-8 bytes
    assert usage.completion_tokens == max(reply.usage.completion_tokens,
                                          len(reply.choices[0].message.content.encode()))
    [event] = _audit_events(api, name)
    assert event.event_type == "api_request" and event.outcome == "ok"
    assert "你好" not in event.payload_enc  # sealed, like every audit payload


def test_guided_choice_reaches_the_model_and_the_reply_is_one_of_them(api, key, client):
    """vLLM's ``guided_choice`` passes through to the model server (the fake answers with the
    last choice, as a constrained model would answer with one of them), plain and streamed."""
    choices = ["年假 10 天 [1]", "抱歉，我在知识库里没有找到这个问题的答案。"]
    reply = client.chat.completions.create(model=MODEL, messages=HELLO,
                                           extra_body={"guided_choice": choices})
    assert reply.choices[0].message.content == choices[-1]
    stream = client.chat.completions.create(model=MODEL, messages=HELLO, stream=True,
                                            extra_body={"guided_choice": choices})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == choices[-1]


def test_streaming_sends_chunks_then_usage_then_done(api, key, client):
    name, _ = key
    stream = client.chat.completions.create(model=MODEL, messages=HELLO, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "答复#1: 你好 API"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(text)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert all(c.usage is None for c in chunks[:-1])
    assert len(_usage_rows(api, name)) == 1
    assert [e.outcome for e in _audit_events(api, name)] == ["ok"]


def test_streaming_wire_format_ends_with_done(api, key):
    resp = requests.post(f"{api.url}/v1/chat/completions", timeout=20, stream=True,
                         headers={"Authorization": f"Bearer {key[1]}"},
                         json={"model": MODEL, "messages": HELLO, "stream": True})
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    lines = [line for line in resp.iter_lines(decode_unicode=True) if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"


def test_missing_or_bad_key_is_401(api):
    with pytest.raises(openai.AuthenticationError) as info:
        api.client("sk-not-a-key").chat.completions.create(model=MODEL, messages=HELLO)
    assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    resp = requests.get(f"{api.url}/v1/models", timeout=5)
    assert resp.status_code == 401 and resp.json()["error"]["type"] == "invalid_request_error"


def test_a_reasoning_models_thinking_reaches_the_official_client_apart(client):
    """API_REASONING=separate (the default): the client reads ``reasoning_content`` beside
    ``content``, in a plain answer and in a stream (tests/app/web/api/test_reasoning.py has the rest)."""
    question = [{"role": "user", "content": "年假有几天？ #reasoning=inline"}]
    reply = client.chat.completions.create(model=MODEL, messages=question)
    assert reply.choices[0].message.content == "答复#1: 年假有几天？ #reasoning=inline"
    assert reply.choices[0].message.reasoning_content == THINKING
    chunks = list(client.chat.completions.create(model=MODEL, messages=question, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == reply.choices[0].message.content
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == THINKING


@pytest.mark.parametrize("body, param", [
    ({"model": MODEL}, "messages"),
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"model": MODEL, "messages": HELLO, "temperature": 3}, "temperature"),
    ({"model": MODEL, "messages": HELLO, "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "messages": HELLO, "top_p": 0}, "top_p"),
    ({"model": MODEL, "messages": HELLO, "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "messages": HELLO, "max_tokens": 10**9}, "max_tokens"),
    ({"model": MODEL, "messages": HELLO, "stream": "yes"}, "stream"),
    ({"model": MODEL, "messages": HELLO, "n": 2}, "n"),
    ({"model": MODEL, "messages": HELLO, "stop": [1]}, "stop"),
    ({"model": MODEL, "messages": HELLO, "guided_choice": []}, "guided_choice"),
    ({"model": MODEL, "messages": HELLO, "guided_choice": ["yes", " "]}, "guided_choice"),
    ({"model": MODEL, "messages": HELLO, "guided_choice": "yes"}, "guided_choice"),
    ({"model": MODEL, "messages": HELLO, "guided_choice": ["x"] * 65}, "guided_choice"),
    ({"model": MODEL, "messages": HELLO, "guided_choice": ["x"], "choice_scoring": "best"}, "choice_scoring"),
    ({"model": MODEL, "messages": HELLO, "guided_choice": ["x"], "choice_bias": [1]}, "choice_bias"),
    ({"model": MODEL, "messages": HELLO, "guided_choice": ["x", "y"], "choice_scoring": "likelihood",
      "choice_bias": [1]}, "choice_bias"),
    ({"model": MODEL, "messages": HELLO, "guided_choice": ["x"], "choice_scoring": "likelihood",
      "choice_bias": ["high"]}, "choice_bias"),
    ({"messages": HELLO}, "model"),
    ([1, 2], None),
])
def test_invalid_requests_are_400_naming_the_field(api, key, body, param):
    resp = requests.post(f"{api.url}/v1/chat/completions", json=body, timeout=5,
                         headers={"Authorization": f"Bearer {key[1]}"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_malformed_json_and_huge_bodies_are_4xx_not_500(api, key):
    headers = {"Authorization": f"Bearer {key[1]}", "Content-Type": "application/json"}
    resp = requests.post(f"{api.url}/v1/chat/completions", data=b"{not json", headers=headers,
                         timeout=5)
    assert resp.status_code == 400 and "JSON" in resp.json()["error"]["message"]
    resp = requests.post(f"{api.url}/v1/chat/completions", data=b"x" * (2 * 1024 * 1024),
                         headers=headers, timeout=10)
    assert resp.status_code == 413 and "error" in resp.json()


def test_invalid_request_through_the_client_is_bad_request_error(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=HELLO, temperature=5)
    assert info.value.param == "temperature"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=HELLO)
    assert info.value.code == "model_not_found"


def test_over_the_rate_limit_is_429_with_retry_after(api):
    _, secret = api.new_key(rate_limit=2)
    client = api.client(secret)
    # Both gunicorn workers count in the same Redis window. A fixed window lets at most 2 x 2
    # through if the calls straddle a minute boundary, so the 5th call is refused at the latest.
    answered = 0
    with pytest.raises(openai.RateLimitError) as info:
        for _ in range(5):
            client.chat.completions.create(model=MODEL, messages=HELLO)
            answered += 1
    assert 2 <= answered <= 4
    assert info.value.code == "rate_limit_exceeded"
    assert 1 <= int(info.value.response.headers["Retry-After"]) <= 60


def test_over_the_api_key_budget_is_429_with_retry_after(api, key, client):
    name, _ = key
    with api.db.transaction() as session:
        set_price(session, MODEL, "1000", "1000", "1000")  # per million: a call costs ~0.03
        set_budget(session, "api_key", name, "day", "0.01")
    client.chat.completions.create(model=MODEL, messages=HELLO)  # admitted: the budget was unspent
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model=MODEL, messages=HELLO)
    assert info.value.code == info.value.type == "insufficient_quota"
    assert 1 <= int(info.value.response.headers["Retry-After"]) <= 86400
    assert [e.outcome for e in _audit_events(api, name)] == ["ok", "budget_block"]


def test_model_server_failing_is_503(api, key, client):
    name, _ = key
    api.model.fail_next = 3  # the backend's first try and its two retries
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model=MODEL, messages=HELLO)
    assert info.value.status_code == 503 and info.value.code == "model_unavailable"
    assert info.value.response.headers["Retry-After"]
    assert time.monotonic() - started < 10
    api.model.fail_next = 3
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model=MODEL, messages=HELLO, stream=True)
    assert info.value.status_code == 503
    api.model.fail_next = 0
    assert _usage_rows(api, name) == []
    assert [e.outcome for e in _audit_events(api, name)] == ["model_error", "model_error"]


def test_unknown_api_routes_and_methods_answer_in_openai_shape(api, key):
    headers = {"Authorization": f"Bearer {key[1]}"}
    resp = requests.get(f"{api.url}/v1/embeddings", headers=headers, timeout=5)
    assert resp.status_code == 404 and resp.json()["error"]["type"] == "invalid_request_error"
    resp = requests.get(f"{api.url}/v1/chat/completions", headers=headers, timeout=5)
    assert resp.status_code == 405 and "error" in resp.json()


def test_an_assistant_turn_without_content_is_accepted(client):
    reply = client.chat.completions.create(model=MODEL, messages=[
        {"role": "user", "content": "a"}, {"role": "assistant", "content": None},
        {"role": "user", "content": "b"}])
    assert reply.choices[0].message.content == "答复#2: b"


def _generated_tokens(api) -> float:
    text = requests.get(f"{api.url}/metrics", timeout=5).text
    series = f'wecom_bot_generated_tokens_total{{model="{MODEL}"}} '
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series))


def test_api_generations_count_in_the_web_metrics(api, client):
    before = _generated_tokens(api)
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=50)
    assert _generated_tokens(api) == before + reply.usage.completion_tokens
