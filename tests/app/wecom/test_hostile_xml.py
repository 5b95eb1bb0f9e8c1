"""Hostile XML and bodies the gunicorn tests (tests/app/web/test_callback_rejections.py) do not
send: entity tricks in the *signed* inner message and in the envelope, external DTDs, a quadratic
blow-up, and an oversized body without a Content-Length. All refused with a 4xx, nothing stored.
"""

import io

import pytest
from sqlalchemy import func, select

from app import migrate
from app.models import InboundMessage
from app.services import Services
from app.web.factory import create_app
from tests.support.callbacks import CallbackForger
from tests.support.env import make_env, settings_from

pytestmark = pytest.mark.faults

HEAD = ("<xml><ToUserName>x</ToUserName><FromUserName>u</FromUserName><CreateTime>1</CreateTime>"
        "<MsgType>text</MsgType>")
INNER = {
    "xxe file": '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
                + HEAD + "<Content>&e;</Content><MsgId>1</MsgId></xml>",
    "xxe url": '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "http://127.0.0.1:1/x">]>'
               + HEAD + "<Content>&e;</Content><MsgId>1</MsgId></xml>",
    "parameter entity": '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY % p SYSTEM "file:///etc/passwd"> %p;]>'
                        + HEAD + "<Content>a</Content><MsgId>1</MsgId></xml>",
    "external dtd": '<?xml version="1.0"?><!DOCTYPE xml SYSTEM "http://127.0.0.1:1/evil.dtd">'
                    + HEAD + "<Content>a</Content><MsgId>1</MsgId></xml>",
    "quadratic blowup": '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "' + "A" * 2000 + '">]>'
                        + HEAD + "<Content>" + "&a;" * 2000 + "</Content><MsgId>1</MsgId></xml>",
}
ENVELOPE = {
    "billion laughs": '<?xml version="1.0"?><!DOCTYPE l [<!ENTITY l "lol"><!ENTITY l2 "&l;&l;&l;&l;&l;&l;">'
                      '<!ENTITY l3 "&l2;&l2;&l2;&l2;&l2;&l2;">]><xml><Encrypt>&l3;</Encrypt></xml>',
    "external dtd": '<?xml version="1.0"?><!DOCTYPE xml SYSTEM "file:///etc/passwd"><xml><Encrypt>a</Encrypt></xml>',
    "processing instruction only": "<?xml-stylesheet href='x'?>",
    "not xml": "\x00\xff garbage",
}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('hostile') / 'h.sqlite3'}"
    migrate.upgrade(url)
    return make_env(DATABASE_URL=url, CELERY_BROKER_URL="redis://127.0.0.1:1/0")


@pytest.fixture(scope="module")
def services(env):
    return Services(settings_from(env))


@pytest.fixture(scope="module")
def forger(env):
    return CallbackForger(env)


@pytest.fixture(scope="module")
def client(services):
    return create_app(services=services).test_client()


@pytest.fixture
def nothing_stored(services):
    yield
    with services.db.session() as session:
        assert session.scalar(select(func.count()).select_from(InboundMessage)) == 0


@pytest.mark.parametrize("name", INNER)
def test_entity_tricks_inside_the_signed_message_are_refused(client, forger, nothing_stored, name):
    params, body = forger.request(INNER[name])
    response = client.post("/wecom/callback", query_string=params, data=body)
    assert response.status_code == 400, (name, response.get_data()[:200])
    assert b"passwd" not in response.data and b"root:" not in response.data


@pytest.mark.parametrize("name", ENVELOPE)
def test_hostile_envelopes_are_refused(client, forger, nothing_stored, name):
    params, _ = forger.request("x")
    response = client.post("/wecom/callback", query_string=params, data=ENVELOPE[name].encode("latin-1"))
    # 400 only: the envelope is parsed before the signature is checked, so a 403 would mean the
    # DTD was accepted and its entities expanded into an Encrypt that merely failed to verify.
    assert response.status_code == 400, (name, response.status_code)
    assert response.get_json() == {"error": "malformed xml"}


def test_oversized_chunked_body_is_refused(client, forger, nothing_stored):
    params, _ = forger.request("x")
    big = b"<xml><Encrypt>" + b"A" * (200 * 1024) + b"</Encrypt></xml>"
    response = client.post("/wecom/callback", query_string=params, input_stream=io.BytesIO(big),
                           headers={"Transfer-Encoding": "chunked"},
                           environ_overrides={"wsgi.input_terminated": True})  # as gunicorn sets it
    assert response.status_code == 413

