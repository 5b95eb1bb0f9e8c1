"""Property-based fuzzing of every door bad input comes through: the callback endpoint, the XML
parser, the WeCom crypto and the OpenAI-compatible API. Never a 500, never an uncaught exception.

The callback and the API run in Flask's test client over a real SQLite file and Redis DB 3
(the model is the fake OpenAI server), so a case costs milliseconds. The ``faults`` hypothesis
profile (the default here) runs about 4,500 cases in total; ``HYPOTHESIS_PROFILE=faults-long``
runs about fourteen times more.
"""

import base64
import contextlib
import json
import os
import time

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import create_app, migrate
from app.api.keys import create_key
from app.services import Services
from app.wecom.crypto import WeComCrypto
from app.wecom.exceptions import WeComCryptoError
from app.wecom.messages import MessageParseError, parse_message
from tests.faults.conftest import WECOM_DB
from tests.support.callbacks import CallbackForger
from tests.support.env import make_env, settings_from
from tests.support.openai_server import FakeOpenAIServer

pytestmark = pytest.mark.filterwarnings("ignore")

COMMON = {"deadline": None, "derandomize": True, "database": None,
          "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}
settings.register_profile("faults", max_examples=350, **COMMON)
settings.register_profile("faults-long", max_examples=5000, **COMMON)
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "faults"))
PROFILE_FAST = settings(PROFILE, max_examples=PROFILE.max_examples * 2)  # the pure functions
REFUSED = {400, 403, 404, 405, 413}

FIELDS = ["ToUserName", "FromUserName", "CreateTime", "MsgType", "Content", "MsgId", "AgentID",
          "Event", "EventKey", "PicUrl", "MediaId", "Format", "Location_X", "Location_Y", "Scale",
          "Label", "Title", "Description", "Url", "Latitude", "Longitude", "Precision", "ThumbMediaId"]
MSGTYPES = ["text", "image", "voice", "video", "location", "link", "event", "", "TEXT", "x" * 300]
texts = st.text(max_size=200)
values = st.one_of(texts, st.integers().map(str), st.sampled_from(MSGTYPES),
                   st.sampled_from(["subscribe", "enter_agent", "click", "view", "LOCATION"]))


@st.composite
def wecom_xml(draw) -> str:
    """XML shaped like a WeCom message: known tags, random values, sometimes CDATA or nesting."""
    parts = []
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=12)):
        value = draw(values)
        style = draw(st.integers(0, 3))
        if style == 0:
            value = f"<![CDATA[{value}]]>"
        elif style == 1:
            value = value.replace("&", "&amp;").replace("<", "&lt;")
        elif style == 2:
            value = f"<{name}>{value}</{name}>"
        parts.append(f"<{name}>{value}</{name}>")
    body = "".join(parts)
    if draw(st.booleans()):
        body = body[: draw(st.integers(0, max(0, len(body))))]  # truncated
    return f"<xml>{body}</xml>"


any_xml = st.one_of(wecom_xml(), texts, st.binary(max_size=300))


@PROFILE_FAST
@given(any_xml)
def test_parser_answers_a_message_or_a_parse_error(xml):
    with contextlib.suppress(MessageParseError):
        parse_message(xml)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'fuzz.sqlite3'}"
    migrate.upgrade(url)
    model = FakeOpenAIServer().start()
    values = make_env(DATABASE_URL=url, REDIS_URL=f"redis://127.0.0.1:6379/{WECOM_DB}",
                      INFERENCE_BACKEND="openai", OPENAI_BASE_URL=model.url, OPENAI_MODEL="fake-glm",
                      CELERY_BROKER_URL="redis://127.0.0.1:1/0")  # publishing fails fast: rows stay queued
    yield values
    model.stop()
    redis.Redis(db=WECOM_DB).flushdb()


@pytest.fixture(scope="module")
def crypto(env):
    return WeComCrypto(env["WECOM_TOKEN"], env["WECOM_AES_KEY"], env["WECOM_CORP_ID"])


@PROFILE_FAST
@given(st.one_of(st.text(max_size=300), st.binary(max_size=300).map(lambda b: base64.b64encode(b).decode())))
def test_decrypt_of_garbage_is_a_crypto_error(crypto, encrypt):
    with contextlib.suppress(WeComCryptoError):
        crypto.decrypt(encrypt)


@PROFILE_FAST
@given(st.binary(max_size=400), st.text(max_size=50), st.text(max_size=20), st.text(max_size=20))
def test_decrypt_message_of_garbage_is_a_crypto_error(crypto, body, signature, timestamp, nonce):
    with contextlib.suppress(WeComCryptoError):
        crypto.decrypt_message(body, signature, timestamp, nonce)


@PROFILE_FAST
@given(st.text(max_size=500))
def test_encrypt_decrypt_round_trip(crypto, text):
    assert crypto.decrypt(crypto.encrypt(text)) == text.encode()


@pytest.fixture(scope="module")
def client(env):
    app = create_app(services=Services(settings_from(env)))
    return app.test_client()


@PROFILE
@given(st.dictionaries(st.sampled_from(["msg_signature", "timestamp", "nonce", "echostr", "x"]),
                       st.text(max_size=60), max_size=5),
       st.one_of(st.binary(max_size=500), wecom_xml().map(str.encode)))
def test_unsigned_callbacks_are_refused_never_500(client, params, body):
    for method in ("POST", "GET"):
        response = client.open("/wecom/callback", method=method, query_string=params, data=body)
        assert response.status_code in REFUSED, (response.status_code, response.get_data()[:200])


@PROFILE
@given(wecom_xml())
def test_signed_callbacks_with_random_messages_never_500(client, env, xml):
    """Correctly signed and encrypted, so the fuzz reaches the parser and the outbox."""
    params, body = CallbackForger(env).request(xml)
    response = client.post("/wecom/callback", query_string=params, data=body)
    assert response.status_code in REFUSED | {200}, (response.status_code, response.get_data()[:200])


@PROFILE
@given(st.integers(-10**6, 10**6))
def test_timestamps_outside_the_window_are_refused(client, env, offset):
    forger = CallbackForger(env)
    params, body = forger.request(forger.message_xml("replay"), timestamp=int(time.time()) + offset)
    status = client.post("/wecom/callback", query_string=params, data=body).status_code
    window = settings_from(env).callback_timestamp_window_s
    if abs(offset) < window - 2:
        assert status == 200
    elif abs(offset) > window + 2:  # a replay (or a clock far ahead): refused
        assert status == 403


@pytest.fixture(scope="module")
def api_key(env, client):
    services = Services(settings_from(env))
    with services.db.transaction() as session:
        _, key = create_key(session, services.blind_index, "fuzz", 10**6)
    return {"Authorization": f"Bearer {key}"}


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), texts),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=12)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "", "x"]),
     "content": st.one_of(texts, json_values)}), max_size=4)
chat_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"model": st.sampled_from(["fake-glm", "", "other"]), "messages": messages},
                          optional={"stream": json_values, "max_tokens": json_values,
                                    "temperature": json_values, "top_p": json_values, "stop": json_values,
                                    "n": json_values, "stream_options": json_values, "user": json_values}))


@PROFILE
@given(chat_bodies)
def test_chat_completions_never_500(client, api_key, body):
    response = client.post("/v1/chat/completions", data=json.dumps(body), headers=api_key,
                           content_type="application/json")
    assert response.status_code in REFUSED | {200, 429}, (response.status_code, response.get_data()[:300])
    if response.status_code != 200:
        assert "error" in response.get_json()
    response.close()


@PROFILE
@given(st.binary(max_size=300), st.sampled_from(["application/json", "text/plain", ""]))
def test_chat_completions_with_raw_garbage_never_500(client, api_key, raw, content_type):
    response = client.post("/v1/chat/completions", data=raw, headers=api_key, content_type=content_type)
    assert response.status_code in REFUSED | {415, 429}, response.status_code
