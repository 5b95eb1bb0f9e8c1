"""A reasoning model behind /v1: the think part is ``reasoning_content`` beside ``content``
(``API_REASONING=separate``) or dropped (``strip``), never part of ``content``.

The app in-process, its ``openai`` backend pointed at the fake model server answering as GLM-4.5+
does (thinking inline, after a pre-filled ``<think>``, or apart; ``#reasoning=MODE`` in the
question picks one), with the default ``OPENAI_REPLY_START=auto``.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from app import migrate
from app.models import UsageRecord
from app.services import Services
from app.web.api.keys import create_key
from app.web.factory import create_app
from tests.support.env import make_env, redis_url, settings_from
from tests.support.openai_server import THINKING, FakeOpenAIServer, reply_for, written

MODEL = "fake-glm"


@pytest.fixture(scope="module")
def model():
    server = FakeOpenAIServer().start()
    yield server
    server.stop()


@pytest.fixture(params=["separate", "strip"])
def api(request, tmp_path, model):
    url = f"sqlite:///{tmp_path / 'api.sqlite3'}"
    migrate.upgrade(url)
    settings = settings_from(make_env(
        DATABASE_URL=url, REDIS_URL=redis_url(13), INFERENCE_BACKEND="openai",
        OPENAI_BASE_URL=model.url, OPENAI_MODEL=MODEL, OPENAI_TIMEOUT_S="10",
        API_REASONING=request.param))
    services = Services(settings)
    app = create_app(settings, services)
    with services.db.transaction() as session:
        _, key = create_key(session, services.blind_index, "reasoning")
    yield app.test_client(), {"Authorization": f"Bearer {key}"}, request.param, services
    services.db.dispose()


def ask(mode: str) -> list[dict]:
    return [{"role": "system", "content": "be brief"},
            {"role": "user", "content": f"年假有几天？ #reasoning={mode}"}]


def events(resp) -> list[dict]:
    lines = [line for line in resp.get_data(as_text=True).split("\n\n") if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: "):]) for line in lines[:-1]]


@pytest.mark.parametrize("mode", ["inline", "prefilled", "separate"])
def test_content_is_the_answer_and_the_thinking_is_beside_it_or_gone(api, mode):
    client, headers, setting, services = api
    resp = client.post("/v1/chat/completions", headers=headers,
                       json={"model": MODEL, "messages": ask(mode)})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    message = resp.get_json()["choices"][0]["message"]
    assert message["content"] == reply_for(ask(mode))
    if setting == "separate":
        assert message["reasoning_content"] == THINKING
    else:
        assert "reasoning_content" not in message
    assert THINKING not in resp.get_data(as_text=True) or setting == "separate"
    with services.db.session() as session:
        [usage] = session.scalars(select(UsageRecord))
    reasoning, content, _ = written(reply_for(ask(mode)), mode)
    # The thinking is billed: the server's count, or the bytes of the answer and the thinking
    # where that is larger.
    assert usage.completion_tokens == max(len(reasoning + content),
                                          len(message["content"].encode()) + len(THINKING.encode()) + 2)


@pytest.mark.parametrize("mode", ["inline", "prefilled", "separate"])
def test_a_stream_sends_the_thinking_as_delta_reasoning_content_or_not_at_all(api, mode):
    client, headers, setting, _ = api
    resp = client.post("/v1/chat/completions", headers=headers,
                       json={"model": MODEL, "messages": ask(mode), "stream": True,
                             "stream_options": {"include_usage": True}})
    chunks = events(resp)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == reply_for(ask(mode))
    assert all(THINKING[:8] not in (d.get("content") or "") for d in deltas)
    thinking = "".join(d.get("reasoning_content") or "" for d in deltas)
    assert thinking == (THINKING if setting == "separate" else "")
    if setting == "separate":  # the thinking comes first, as it was written
        first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
        assert all("reasoning_content" not in d for d in deltas[first_content:])
    assert chunks[-1]["usage"]["completion_tokens"] > len(THINKING)


def test_a_reply_cut_off_while_thinking_has_empty_content(api):
    client, headers, setting, _ = api
    resp = client.post("/v1/chat/completions", headers=headers,
                       json={"model": MODEL, "messages": ask("cutoff")})
    choice = resp.get_json()["choices"][0]
    assert choice["message"]["content"] == "" and choice["finish_reason"] == "length"
    assert choice["message"].get("reasoning_content") == (THINKING if setting == "separate" else None)


def test_enable_thinking_reaches_the_model_server(api, model):
    client, headers, _, _ = api
    body = {"model": MODEL, "messages": ask("inline"),
            "chat_template_kwargs": {"enable_thinking": False, "other": 1}}
    assert client.post("/v1/chat/completions", headers=headers, json=body).status_code == 200
    assert model.last_body["chat_template_kwargs"] == {"enable_thinking": False}
    assert client.post("/v1/chat/completions", headers=headers,
                       json={"model": MODEL, "messages": ask("inline")}).status_code == 200
    assert "chat_template_kwargs" not in model.last_body


@pytest.mark.parametrize("kwargs, param", [
    ("off", "chat_template_kwargs"),
    ({"enable_thinking": "no"}, "chat_template_kwargs.enable_thinking"),
])
def test_bad_chat_template_kwargs_are_400(api, kwargs, param):
    client, headers, _, _ = api
    resp = client.post("/v1/chat/completions", headers=headers,
                       json={"model": MODEL, "messages": ask("inline"), "chat_template_kwargs": kwargs})
    assert resp.status_code == 400 and resp.get_json()["error"]["param"] == param
