"""Input that once made a 500 (an exception escaping its check) answers a 4xx instead.

Each is a single request an unauthenticated caller (or one holding any API key) can send:
a 400-digit timestamp (``float`` conversion overflowed), JSON nested thousands deep
(``RecursionError`` in the parser), and database ids beyond a 64-bit column. The fuzz suite
(``test_fuzz.py``) draws more of each; these are the fixed cases.
"""

import json
import time

import pytest

from app import migrate
from app.services import Services
from app.web.api.keys import create_key
from app.web.factory import create_app
from app.wecom.crypto import WeComCrypto
from scripts.dev_env import random_aes_key
from tests.support.callbacks import CallbackForger
from tests.support.env import make_env, settings_from
from tests.support.openai_server import FakeOpenAIServer

pytestmark = pytest.mark.faults

HUGE = "9" * 400
DEEP_ARRAY = "[" * 20_000 + "]" * 20_000  # under the callbacks' 64 KiB
DEEP_OBJECT = '{"a":' * 8_000 + "1" + "}" * 8_000


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('hostile-input') / 'h.sqlite3'}"
    migrate.upgrade(url)
    model = FakeOpenAIServer().start()
    yield make_env(DATABASE_URL=url, CELERY_BROKER_URL="redis://127.0.0.1:1/0",
                   INFERENCE_BACKEND="openai", OPENAI_BASE_URL=model.url, OPENAI_MODEL="fake-glm",
                   AIBOT_TOKEN="aibot-" + random_aes_key()[:20], AIBOT_ENCODING_AES_KEY=random_aes_key())
    model.stop()


@pytest.fixture(scope="module")
def services(env):
    return Services(settings_from(env))


@pytest.fixture(scope="module")
def client(services):
    return create_app(services=services).test_client()


def aibot_crypto(env) -> WeComCrypto:
    return WeComCrypto(env["AIBOT_TOKEN"], env["AIBOT_ENCODING_AES_KEY"], "")


@pytest.mark.parametrize("path", ["/wecom/callback", "/wecom/aibot"])
@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("spell", [lambda now: HUGE, lambda now: "-" + HUGE, lambda now: "1e400",
                                   lambda now: "".join(chr(0x660 + int(d)) for d in now),  # Arabic-Indic
                                   lambda now: " " + now, lambda now: "+" + now,
                                   lambda now: now[:4] + "_" + now[4:], lambda now: now + ".0"])
def test_a_timestamp_that_is_not_a_plain_number_is_a_400(client, path, method, spell):
    """int() takes all of these (but the last); none is how WeCom writes the time."""
    timestamp = spell(str(int(time.time())))
    response = client.open(path, method=method, data=b"<xml><Encrypt>x</Encrypt></xml>",
                           query_string={"msg_signature": "0" * 40, "timestamp": timestamp,
                                         "nonce": "n", "echostr": "x"})
    assert response.status_code == 400, (timestamp[:20], response.status_code, response.get_data()[:200])


@pytest.mark.parametrize("body", [DEEP_ARRAY, DEEP_OBJECT, '{"encrypt": ' + DEEP_ARRAY + "}"])
def test_deeply_nested_json_on_the_aibot_url_is_a_400(client, body):
    params = {"msg_signature": "0" * 40, "timestamp": str(int(time.time())), "nonce": "n"}
    response = client.post("/wecom/aibot", query_string=params, data=body)
    assert response.status_code == 400, response.get_data()[:200]


def test_deeply_nested_json_inside_a_signed_aibot_message_is_a_400(client, env):
    crypto = aibot_crypto(env)
    encrypt = crypto.encrypt('{"msgid": "1", "msgtype": "text", "text": ' + DEEP_OBJECT + "}")
    timestamp, nonce = str(int(time.time())), "n"
    response = client.post("/wecom/aibot", data=json.dumps({"encrypt": encrypt}),
                           query_string={"msg_signature": crypto.signature(timestamp, nonce, encrypt),
                                         "timestamp": timestamp, "nonce": nonce})
    assert response.status_code == 400, response.get_data()[:200]


@pytest.fixture(scope="module")
def api_key(services, client):
    with services.db.transaction() as session:
        _, key = create_key(session, services.blind_index, "hostile", 10**6)
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("body", [DEEP_ARRAY, DEEP_OBJECT,
                                  '{"model": "fake-glm", "messages": [{"role": "user", "content": '
                                  + DEEP_ARRAY[:2000] + DEEP_ARRAY[-2000:] + "}]}"])
def test_deeply_nested_json_on_v1_is_a_400(client, api_key, body):
    response = client.post("/v1/chat/completions", data=body, headers=api_key,
                           content_type="application/json")
    assert response.status_code == 400, response.get_data()[:200]
    assert "error" in response.get_json()


def test_the_signed_path_still_works(client, env):
    """The control: an honest callback with a plain timestamp is accepted."""
    forger = CallbackForger(env)
    params, body = forger.request(forger.message_xml("control"))
    assert client.post("/wecom/callback", query_string=params, data=body).status_code == 200
