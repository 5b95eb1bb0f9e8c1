"""A model that cannot be loaded fails the message with a notice; the row is never left stuck."""

import pytest
import redis
import requests

from app import migrate
from app.llm import LLMError
from app.models import MessageStatus
from app.services import Services
from app.web.factory import create_app
from emulator import EmulatorConfig, EmulatorServer
from tests.support.callbacks import CallbackForger
from tests.support.env import make_env, redis_url, settings_from
from worker.runtime import build_processor

pytestmark = pytest.mark.integration

REDIS_DB = 7


def test_missing_model_fails_with_a_notice(tmp_path):
    r = redis.Redis.from_url(redis_url(REDIS_DB))
    r.flushdb()
    env = make_env(DATABASE_URL=f"sqlite:///{tmp_path / 'bot.sqlite3'}",
                   REDIS_URL=redis_url(REDIS_DB))
    migrate.upgrade(env["DATABASE_URL"])
    with EmulatorServer(EmulatorConfig(corp_id=env["WECOM_CORP_ID"], secret=env["WECOM_SECRET"],
                                       agent_id=int(env["WECOM_AGENT_ID"]), token=env["WECOM_TOKEN"],
                                       aes_key=env["WECOM_AES_KEY"])) as emulator:
        services = Services(settings_from(env, wecom_api_base=emulator.url,
                                          model_dir=str(tmp_path / "no-model")))
        forger = CallbackForger(env)
        user = requests.get(f"{emulator.url}/_emulator/directory", timeout=5).json()["users"][0]["userid"]
        params, body = forger.request(forger.message_xml("你好", user=user))
        client = create_app(services=services).test_client()
        assert client.post("/wecom/callback", query_string=params, data=body).status_code == 200

        processor = build_processor(services)
        try:
            processor.llm  # noqa: B018 - the engine backend refuses a directory without a model
        except LLMError as exc:
            assert not exc.transient
        outcome = processor.process(1)
        assert outcome.status == "done"
        with services.db.session() as session:
            from app.models import InboundMessage

            row = session.get(InboundMessage, 1)
            assert row.status == MessageStatus.FAILED and "model" in row.failure_reason
        sent = requests.get(f"{emulator.url}/_emulator/messages", params={"touser": user}, timeout=5).json()
        assert [m["content"] for m in sent["messages"]] and "稍后再试" in sent["messages"][-1]["content"]
    r.flushdb()
