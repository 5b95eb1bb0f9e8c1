"""What gunicorn and a healthy fake server cannot easily show: engine errors, a model failing
mid-stream, a client hanging up. The app in-process with a scripted backend."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from app import migrate
from app.accounting import set_budget, set_price
from app.llm import Generation, LLMError, StreamDelta
from app.models import AuditEvent, UsageRecord
from app.services import Services
from app.web.api.gateway import Gateway
from app.web.api.keys import create_key
from app.web.factory import create_app
from tests.support.env import make_env, redis_url, settings_from

MESSAGES = [{"role": "user", "content": "hi"}]


class ScriptedBackend:
    model_name = "fake-glm"

    def __init__(self):
        self.error: LLMError | None = None
        self.fail_after: int | None = None  # pieces streamed before the error

    def generate(self, messages, params):
        if self.error:
            raise self.error
        return Generation("hello", self.model_name, 3, 5)

    def stream(self, messages, params):
        for i, piece in enumerate(["hel", "lo", " there"]):
            if self.fail_after is not None and i == self.fail_after:
                raise self.error
            yield StreamDelta(piece)
        yield StreamDelta("", Generation("hello there", self.model_name, 3, 11))


@pytest.fixture
def setup(tmp_path):
    url = f"sqlite:///{tmp_path / 'gw.sqlite3'}"
    migrate.upgrade(url)
    settings = settings_from(make_env(DATABASE_URL=url, REDIS_URL=redis_url(13),
                                      INFERENCE_BACKEND="openai", OPENAI_MODEL="fake-glm"))
    services = Services(settings)
    app = create_app(settings, services)
    backend = ScriptedBackend()
    app.extensions["api_gateway"] = Gateway(services, backend_factory=lambda s: backend)
    with services.db.transaction() as session:
        _, key = create_key(session, services.blind_index, "unit")
    yield app.test_client(), backend, services, {"Authorization": f"Bearer {key}"}
    services.db.dispose()


def _outcomes(services):
    with services.db.session() as session:
        return [e.outcome for e in session.scalars(select(AuditEvent).where(
            AuditEvent.event_type == "api_request").order_by(AuditEvent.seq))]


def _usage(services):
    with services.db.session() as session:
        return list(session.scalars(select(UsageRecord)))


@pytest.mark.parametrize("status, expected", [(400, 400), (503, 503), (401, 503)])
def test_engine_errors_map_to_400_or_503(setup, status, expected):
    client, backend, services, headers = setup
    backend.error = LLMError("boom", transient=status == 503, status=status)
    resp = client.post("/v1/chat/completions", headers=headers,
                       json={"model": "fake-glm", "messages": MESSAGES})
    assert resp.status_code == expected
    assert set(resp.get_json()["error"]) == {"message", "type", "param", "code"}
    assert _usage(services) == [] and _outcomes(services) == ["model_error"]


def test_a_failure_mid_stream_is_an_error_event_and_charges_what_was_sent(setup):
    client, backend, services, headers = setup
    backend.error, backend.fail_after = LLMError("out of memory", status=503), 2
    resp = client.post("/v1/chat/completions", headers=headers,
                       json={"model": "fake-glm", "messages": MESSAGES, "stream": True})
    assert resp.status_code == 200
    events = [line[6:] for line in resp.get_data(as_text=True).splitlines() if line]
    assert json.loads(events[-1])["error"]["code"] == "model_unavailable"
    assert "[DONE]" not in events
    [usage] = _usage(services)
    assert usage.completion_tokens == len("hello")
    assert _outcomes(services) == ["model_error"]


def test_a_client_hanging_up_is_still_charged(setup):
    client, _, services, headers = setup
    resp = client.post("/v1/chat/completions", headers=headers, buffered=False,
                       json={"model": "fake-glm", "messages": MESSAGES, "stream": True})
    stream = iter(resp.response)
    next(stream), next(stream)  # the role chunk and "hel"
    resp.close()
    [usage] = _usage(services)
    assert usage.completion_tokens == len("hel")
    assert _outcomes(services) == ["disconnected"]


def test_a_server_without_usage_is_charged_the_estimate_at_the_configured_price(setup):
    client, backend, services, headers = setup
    with services.db.transaction() as session:
        set_price(session, "fake-glm", 10, 2, 30)
        set_budget(session, "api_key", "unit", "day", "100")
    silent = Generation("hello 😀", "renamed-by-server", 0, 0)
    backend.generate = lambda messages, params: silent
    messages = [{"role": "user", "content": "𠀀𪚥 emoji 🎉"}]
    resp = client.post("/v1/chat/completions", headers=headers,
                       json={"model": "fake-glm", "messages": messages})
    assert resp.status_code == 200
    [usage] = _usage(services)
    assert usage.model == "fake-glm"
    assert usage.prompt_tokens > len(messages[0]["content"].encode())
    assert usage.completion_tokens >= len("hello 😀".encode()) and usage.cost > 0


def test_a_client_hanging_up_is_charged_the_bytes_it_got(setup):
    client, backend, services, headers = setup
    backend.stream = lambda messages, params: iter([StreamDelta("😀😀"), StreamDelta("🎉")])
    resp = client.post("/v1/chat/completions", headers=headers, buffered=False,
                       json={"model": "fake-glm", "messages": MESSAGES, "stream": True})
    stream = iter(resp.response)
    next(stream), next(stream)  # the role chunk and the first piece
    resp.close()
    [usage] = _usage(services)
    assert usage.completion_tokens >= len("😀😀".encode())


def test_a_database_outage_is_503_not_500(setup, monkeypatch):
    from sqlalchemy.exc import OperationalError

    import app.web.api as api

    client, _, _, headers = setup

    def down(*args, **kwargs):
        raise OperationalError("SELECT", {}, Exception("database is locked"))

    monkeypatch.setattr(api, "authenticate", down)
    resp = client.post("/v1/chat/completions", headers=headers,
                       json={"model": "fake-glm", "messages": MESSAGES})
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "5"
    assert resp.get_json()["error"]["code"] == "storage_unavailable"


def test_guided_choice_replies_are_counted_in_usage_and_budgets(setup):
    """64 replies of 300 characters are tokens the engine processes (scored whole, or walked
    by the constraint): the server reports the 3 prompt tokens, the ledger charges at least the
    replies' bytes, and the budget they used up refuses the next call."""
    from app.accounting import estimate_choice_tokens

    client, _, services, headers = setup
    choices = [f"{i:02d}" + "长" * 298 for i in range(64)]
    with services.db.transaction() as session:
        set_price(session, "fake-glm", 10, 2, 30)
        set_budget(session, "api_key", "unit", "day", "0.5")  # the replies alone cost ~0.57
    resp = client.post("/v1/chat/completions", headers=headers,
                       json={"model": "fake-glm", "messages": MESSAGES, "max_tokens": 16,
                             "guided_choice": choices})
    assert resp.status_code == 200
    [usage] = _usage(services)
    assert usage.prompt_tokens >= estimate_choice_tokens(choices) >= 64 * 300
    after = client.post("/v1/chat/completions", headers=headers,
                        json={"model": "fake-glm", "messages": MESSAGES, "max_tokens": 16})
    assert after.status_code == 429  # charged as 3 tokens, the replies would have left room
