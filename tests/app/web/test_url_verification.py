"""URL verification (GET ``?echostr=``) is no decryption oracle, on both callback URLs.

WeCom's "save the callback URL" check sends an encrypted random number and expects its
plaintext back. The same key encrypts every message, so a handler that answers any decryptable
``echostr`` turns a captured POST's ``Encrypt`` (replayed with its own signature, timestamp and
nonce) into the message's plaintext. The GET is held to the POST's timestamp window, and only a
plaintext shaped like an echostr (a short token of letters and digits) is echoed, never XML or
JSON, whatever its age.
"""

import json
import time

import pytest

from app import migrate
from app.services import Services
from app.web.factory import create_app
from app.wecom.crypto import WeComCrypto
from scripts.dev_env import random_aes_key
from tests.support.callbacks import CallbackForger
from tests.support.env import make_env, settings_from

pytestmark = pytest.mark.faults

SECRET_TEXT = "工资单 salary slip 2024"
ECHO = "1288432023552776189"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('verify') / 'v.sqlite3'}"
    migrate.upgrade(url)
    return make_env(DATABASE_URL=url, CELERY_BROKER_URL="redis://127.0.0.1:1/0",
                    AIBOT_TOKEN="aibot-" + random_aes_key()[:20], AIBOT_ENCODING_AES_KEY=random_aes_key())


@pytest.fixture(scope="module")
def client(env):
    return create_app(services=Services(settings_from(env))).test_client()


CHANNELS = {
    "app": ("/wecom/callback", lambda env: CallbackForger(env).crypto),
    "aibot": ("/wecom/aibot", lambda env: WeComCrypto(env["AIBOT_TOKEN"], env["AIBOT_ENCODING_AES_KEY"], "")),
}


def captured_plaintext(channel: str, env) -> str:
    """What a real POST of the channel carries inside its Encrypt."""
    if channel == "app":
        return CallbackForger(env).message_xml(SECRET_TEXT)
    return json.dumps({"msgid": "m1", "msgtype": "text", "from": {"userid": "zhangwei"},
                       "text": {"content": SECRET_TEXT}}, ensure_ascii=False)


def get(client, path, crypto, plaintext, timestamp):
    """A GET whose echostr is ``plaintext`` encrypted and signed as WeCom would (or as the
    captured POST was: the signature covers exactly these four values)."""
    encrypt = crypto.encrypt(plaintext)
    timestamp, nonce = str(timestamp), "47744683"
    return client.get(path, query_string={"msg_signature": crypto.signature(timestamp, nonce, encrypt),
                                          "timestamp": timestamp, "nonce": nonce, "echostr": encrypt})


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_real_echostr_is_echoed(client, env, channel):
    path, crypto = CHANNELS[channel]
    response = get(client, path, crypto(env), ECHO, int(time.time()))
    assert response.status_code == 200
    assert response.get_data(as_text=True) == ECHO


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_captured_message_replayed_as_echostr_is_refused(client, env, channel):
    """Fresh timestamp (a capture replayed within the window): the plaintext is not an echostr."""
    path, crypto = CHANNELS[channel]
    response = get(client, path, crypto(env), captured_plaintext(channel, env), int(time.time()))
    assert 400 <= response.status_code < 500, response.status_code
    assert SECRET_TEXT.encode() not in response.data and b"zhangwei" not in response.data


@pytest.mark.parametrize("channel", CHANNELS)
def test_an_old_verification_is_refused(client, env, channel):
    """Even a genuine echostr: an old (or far future) timestamp is a replay, as on POST."""
    path, crypto = CHANNELS[channel]
    for offset in (-3600, -86400 * 365, 3600):
        response = get(client, path, crypto(env), ECHO, int(time.time()) + offset)
        assert response.status_code == 403, (offset, response.status_code)
        assert b"window" in response.data


@pytest.mark.parametrize("channel", CHANNELS)
@pytest.mark.parametrize("plaintext", ["<xml/>", "{}", "a b", "x" * 200, "你好", ""])
def test_only_an_echostr_shaped_plaintext_is_echoed(client, env, channel, plaintext):
    path, crypto = CHANNELS[channel]
    response = get(client, path, crypto(env), plaintext, int(time.time()))
    assert 400 <= response.status_code < 500, (plaintext, response.status_code)
