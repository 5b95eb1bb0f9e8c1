"""Property-based fuzzing of every door bad input comes through: the callback endpoints (the
app's and the AI bot's, POST and URL verification), the XML parser, the WeCom crypto, the
OpenAI-compatible API and the admin forms. Never a 500, never an uncaught exception: every
response's status is checked against the few a refusal may have.

The apps run in Flask's test client over a real SQLite file and Redis DB 3 (the model is the
fake OpenAI server), so a case costs milliseconds. The ``faults`` hypothesis profile (the
default here) runs over 10,000 cases in total (``test_the_suite_ran_ten_thousand_cases`` counts
them); ``HYPOTHESIS_PROFILE=faults-long`` runs about ten times more.
"""

import base64
import collections
import contextlib
import json
import os
import re
import sys
import time
from datetime import date

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import migrate
from app.services import Services
from app.web.api.keys import create_key
from app.web.factory import create_app
from app.wecom.crypto import WeComCrypto
from app.wecom.exceptions import ValidateSignatureError, WeComCryptoError
from app.wecom.messages import MessageParseError, parse_message
from tests.support.callbacks import CallbackForger
from tests.support.env import make_env, redis_url, settings_from
from tests.support.faults import WECOM_DB
from tests.support.openai_server import FakeOpenAIServer

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.filterwarnings("ignore")]

COMMON = {"deadline": None, "derandomize": True, "database": None,
          "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}
settings.register_profile("faults", max_examples=520, **COMMON)
settings.register_profile("faults-long", max_examples=5000, **COMMON)
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "faults"))
PROFILE_FAST = settings(PROFILE, max_examples=PROFILE.max_examples * 2)  # the pure functions
REFUSED = {400, 403, 404, 405, 413}
CASES: collections.Counter = collections.Counter()  # cases run, per test


def counted() -> None:
    CASES[sys._getframe(1).f_code.co_name] += 1

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
timestamps = st.one_of(st.integers(-10**500, 10**500).map(str), st.integers(0, 2**40).map(str),
                       st.text(max_size=30), st.just(str(int(time.time()))),
                       st.integers(0, 10**10).map(lambda n: f" {n}" if n % 2 else f"+{n}"))
queries = st.fixed_dictionaries({"msg_signature": st.text(max_size=45), "timestamp": timestamps,
                                 "nonce": st.text(max_size=20)},
                                optional={"echostr": st.one_of(st.text(max_size=80), st.binary(max_size=60).map(
                                    lambda b: base64.b64encode(b).decode()))})


@PROFILE_FAST
@given(any_xml)
def test_parser_answers_a_message_or_a_parse_error(xml):
    counted()
    with contextlib.suppress(MessageParseError):
        parse_message(xml)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'fuzz.sqlite3'}"
    migrate.upgrade(url)
    model = FakeOpenAIServer().start()
    values = make_env(DATABASE_URL=url, REDIS_URL=redis_url(WECOM_DB),
                      INFERENCE_BACKEND="openai", OPENAI_BASE_URL=model.url, OPENAI_MODEL="fake-glm",
                      CELERY_BROKER_URL="redis://127.0.0.1:1/0")  # publishing fails fast: rows stay queued
    yield values
    model.stop()
    redis.Redis.from_url(redis_url(WECOM_DB)).flushdb()


@pytest.fixture(scope="module")
def crypto(env):
    return WeComCrypto(env["WECOM_TOKEN"], env["WECOM_AES_KEY"], env["WECOM_CORP_ID"])


@PROFILE_FAST
@given(st.one_of(st.text(max_size=300), st.binary(max_size=300).map(lambda b: base64.b64encode(b).decode())))
def test_decrypt_of_garbage_is_a_crypto_error(crypto, encrypt):
    counted()
    with contextlib.suppress(WeComCryptoError):
        crypto.decrypt(encrypt)


@PROFILE_FAST
@given(st.binary(max_size=400), st.text(max_size=50), st.text(max_size=20), st.text(max_size=20))
def test_decrypt_message_of_garbage_is_a_crypto_error(crypto, body, signature, timestamp, nonce):
    counted()
    with pytest.raises(WeComCryptoError):
        crypto.decrypt_message(body, signature, timestamp, nonce)


@PROFILE_FAST
@given(wecom_xml(), st.text(max_size=50), st.text(max_size=20), st.text(max_size=20))
def test_a_well_encrypted_message_with_a_wrong_signature_is_refused(crypto, xml, signature, timestamp, nonce):
    """The envelope and its Encrypt are genuine, so only the signature check can refuse it."""
    counted()
    encrypt = crypto.encrypt(xml)
    body = f"<xml><Encrypt><![CDATA[{encrypt}]]></Encrypt></xml>"
    if signature == crypto.signature(timestamp, nonce, encrypt):  # pragma: no cover - 2**-160
        return
    with pytest.raises(ValidateSignatureError):
        crypto.decrypt_message(body, signature, timestamp, nonce)
    with pytest.raises(ValidateSignatureError):  # a right signature spelled in upper case
        crypto.decrypt_message(body, crypto.signature(timestamp, nonce, encrypt).upper(), timestamp, nonce)


@PROFILE_FAST
@given(st.text(max_size=500))
def test_encrypt_decrypt_round_trip(crypto, text):
    counted()
    assert crypto.decrypt(crypto.encrypt(text)) == text.encode()


@pytest.fixture(scope="module")
def client(env):
    app = create_app(services=Services(settings_from(env)))
    return app.test_client()


@PROFILE
@given(st.one_of(st.dictionaries(st.sampled_from(["msg_signature", "timestamp", "nonce", "echostr", "x"]),
                                 st.text(max_size=60), max_size=5), queries),
       st.one_of(st.binary(max_size=500), wecom_xml().map(str.encode)))
def test_unsigned_callbacks_are_refused_never_500(client, params, body):
    counted()
    for method in ("POST", "GET"):
        response = client.open("/wecom/callback", method=method, query_string=params, data=body)
        assert response.status_code in REFUSED, (response.status_code, response.get_data()[:200])


@PROFILE
@given(wecom_xml())
def test_signed_callbacks_with_random_messages_never_500(client, env, xml):
    """Correctly signed and encrypted, so the fuzz reaches the parser and the outbox."""
    counted()
    params, body = CallbackForger(env).request(xml)
    response = client.post("/wecom/callback", query_string=params, data=body)
    assert response.status_code in REFUSED | {200}, (response.status_code, response.get_data()[:200])


@PROFILE
@given(st.integers(-10**6, 10**6))
def test_timestamps_outside_the_window_are_refused(client, env, offset):
    counted()
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
    counted()
    response = client.post("/v1/chat/completions", data=json.dumps(body), headers=api_key,
                           content_type="application/json")
    assert response.status_code in REFUSED | {200, 429}, (response.status_code, response.get_data()[:300])
    if response.status_code != 200:
        assert "error" in response.get_json()
    response.close()


@PROFILE
@given(st.binary(max_size=300), st.sampled_from(["application/json", "text/plain", ""]))
def test_chat_completions_with_raw_garbage_never_500(client, api_key, raw, content_type):
    counted()
    response = client.post("/v1/chat/completions", data=raw, headers=api_key, content_type=content_type)
    assert response.status_code in REFUSED | {415, 429}, response.status_code


# -- the timestamp, the AI bot's JSON door and URL verification --------------------------------------
@st.composite
def nested_json(draw) -> str:
    """JSON nested 1..20,000 levels deep (arrays, objects or both), sometimes inside an object."""
    depth = draw(st.one_of(st.integers(1, 80), st.integers(80, 20_000)))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ('[{"b":', "}]")]))
    inner = opener * depth + draw(st.sampled_from(["1", '"x"', "null", "[]"])) + closer * depth
    return draw(st.sampled_from(['{"encrypt": %s}', '{"model": "fake-glm", "messages": %s}', "%s"])) % inner


json_bodies = st.one_of(nested_json(), json_values.map(json.dumps), st.text(max_size=300),
                        st.fixed_dictionaries({"encrypt": st.one_of(texts, json_values)}).map(json.dumps))


@PROFILE
@given(queries, st.one_of(json_bodies, st.binary(max_size=300)))
def test_unsigned_aibot_callbacks_are_refused_never_500(aibot_client, params, body):
    counted()
    for method in ("POST", "GET"):
        response = aibot_client.open("/wecom/aibot", method=method, query_string=params, data=body)
        assert response.status_code in REFUSED, (response.status_code, response.get_data()[:200])


@PROFILE
@given(st.one_of(nested_json(), json_values.map(json.dumps), texts))
def test_signed_aibot_callbacks_with_random_json_never_500(aibot_client, aibot_env, plaintext):
    """Signed and encrypted, so the fuzz reaches the message parser and the outbox."""
    counted()
    crypto = WeComCrypto(aibot_env["AIBOT_TOKEN"], aibot_env["AIBOT_ENCODING_AES_KEY"], "")
    encrypt, timestamp, nonce = crypto.encrypt(plaintext), str(int(time.time())), "n"
    response = aibot_client.post("/wecom/aibot", data=json.dumps({"encrypt": encrypt}),
                                 query_string={"msg_signature": crypto.signature(timestamp, nonce, encrypt),
                                               "timestamp": timestamp, "nonce": nonce})
    assert response.status_code in REFUSED | {200}, (response.status_code, response.get_data()[:200])


feedback_fields = st.fixed_dictionaries({}, optional={
    "id": st.one_of(texts, st.sampled_from(["fb-1-0123456789abcdef", "x" * 300]), json_values),
    "type": st.one_of(st.integers(-3, 5), st.integers(), st.sampled_from(["1", "2", "3", "９"]), json_values),
    "content": st.one_of(texts, json_values),
    "inaccurate_reason_list": st.one_of(st.lists(st.one_of(st.integers(), texts), max_size=20), json_values)})


@PROFILE
@given(st.one_of(feedback_fields, json_values), st.one_of(texts, json_values), st.one_of(texts, json_values))
def test_signed_aibot_feedback_events_with_random_fields_never_500(aibot_client, aibot_env, event, msgid, user):
    """The AI bot's feedback_event (app.feedback.ratings) with anything in its fields: refused, or 200
    (accepted into the outbox or dropped with a log line), never a 500."""
    counted()
    crypto = WeComCrypto(aibot_env["AIBOT_TOKEN"], aibot_env["AIBOT_ENCODING_AES_KEY"], "")
    plaintext = json.dumps({"msgid": msgid, "msgtype": "event", "from": {"userid": user},
                            "event": {"eventtype": "feedback_event", "feedback_event": event}})
    encrypt, timestamp, nonce = crypto.encrypt(plaintext), str(int(time.time())), "n"
    response = aibot_client.post("/wecom/aibot", data=json.dumps({"encrypt": encrypt}),
                                 query_string={"msg_signature": crypto.signature(timestamp, nonce, encrypt),
                                               "timestamp": timestamp, "nonce": nonce})
    assert response.status_code in REFUSED | {200}, (response.status_code, response.get_data()[:200])


ECHOSTR = re.compile(r"[0-9A-Za-z_-]{1,64}")


@PROFILE
@given(st.one_of(st.integers(0, 10**30).map(str), texts, wecom_xml(), json_values.map(json.dumps)),
       st.sampled_from(["/wecom/callback", "/wecom/aibot"]))
def test_url_verification_echoes_only_an_echostr(aibot_client, aibot_env, plaintext, path):
    """Any plaintext, correctly signed with a fresh timestamp: echoed only if it is echostr-shaped."""
    counted()
    crypto = (WeComCrypto(aibot_env["AIBOT_TOKEN"], aibot_env["AIBOT_ENCODING_AES_KEY"], "")
              if path == "/wecom/aibot" else CallbackForger(aibot_env).crypto)
    encrypt, timestamp, nonce = crypto.encrypt(plaintext), str(int(time.time())), "n"
    response = aibot_client.get(path, query_string={"msg_signature": crypto.signature(timestamp, nonce, encrypt),
                                                    "timestamp": timestamp, "nonce": nonce, "echostr": encrypt})
    if ECHOSTR.fullmatch(plaintext):
        assert (response.status_code, response.get_data(as_text=True)) == (200, plaintext)
    else:
        assert response.status_code in REFUSED, (response.status_code, response.get_data()[:200])


@PROFILE
@given(nested_json())
def test_chat_completions_with_deep_json_never_500(client, api_key, body):
    counted()
    response = client.post("/v1/chat/completions", data=body, headers=api_key, content_type="application/json")
    assert response.status_code in REFUSED | {200, 429}, (response.status_code, response.get_data()[:300])
    response.close()


@pytest.fixture(scope="module")
def aibot_env(env):
    from scripts.dev_env import random_aes_key

    return {**env, "AIBOT_TOKEN": "fuzz-" + random_aes_key()[:20], "AIBOT_ENCODING_AES_KEY": random_aes_key()}


@pytest.fixture(scope="module")
def aibot_client(aibot_env):
    return create_app(services=Services(settings_from(aibot_env))).test_client()


# -- the admin forms -------------------------------------------------------------------------------
amounts = st.one_of(st.decimals(allow_nan=True, allow_infinity=True).map(str),
                    st.floats().map(str), st.integers(-10**40, 10**40).map(str), st.text(max_size=20),
                    st.sampled_from(["NaN", "sNaN", "-Infinity", "inf", "1e30", "1E+999999", "0.0000001"]))
days = st.one_of(st.dates().map(date.isoformat), st.text(max_size=12), st.just(""))
moments = st.one_of(st.datetimes().map(lambda d: d.strftime("%Y-%m-%dT%H:%M")), st.text(max_size=16),
                    st.just(""))
ids = st.one_of(st.integers(-10, 10**40).map(str), st.text(max_size=10))


@pytest.fixture(scope="module")
def admin(env):
    from app.web.admin.accounts import create_user
    from tests.app.web.admin.conftest import csrf_token, login

    services = Services(settings_from(env, session_cookie_secure=False))
    app = create_app(services=services)
    app.config["TESTING"] = True
    with services.db.transaction() as session:
        for name, role in (("fuzz-admin", "admin"), ("fuzz-auditor", "auditor")):
            create_user(session, name, role, "correct horse battery")
    clients = {}
    for name in ("fuzz-admin", "fuzz-auditor"):
        clients[name] = client = app.test_client()
        assert login(client, name, "correct horse battery").status_code == 302
        # One token serves the whole session: the forms' own checks are what is fuzzed.
        client.token = csrf_token(client, "/admin/login")
    return clients


@PROFILE
@given(amounts, st.sampled_from(["day", "week", "month"]), st.text(max_size=12), ids)
def test_budget_forms_never_500(admin, limit, period, thresholds, budget_id):
    counted()
    client = admin["fuzz-admin"]
    form = {"scope": "department", "scope_value": "2", "period": period, "limit": limit,
            "action": "block", "thresholds": thresholds or "50,100", "enabled": "y", "csrf_token": client.token}
    for path in ("/admin/budgets/new", f"/admin/budgets/{budget_id}/edit"):
        response = client.post(path, data=form)
        # 308: Werkzeug's redirect of a path with "//" in it (an id of "0/") to the merged one
        assert response.status_code in REFUSED | {200, 302, 308}, (path, limit, response.status_code)


@PROFILE
@given(amounts, amounts, amounts, moments, ids)
def test_price_forms_never_500(admin, input_per_m, cached_per_m, output_per_m, valid_from, base_id):
    counted()
    client = admin["fuzz-admin"]
    response = client.post("/admin/prices/new", data={
        "model": "fuzz", "input_per_m": input_per_m, "cached_per_m": cached_per_m,
        "output_per_m": output_per_m, "currency": "CNY", "valid_from": valid_from, "csrf_token": client.token})
    assert response.status_code in REFUSED | {302}, (input_per_m, valid_from, response.status_code)
    response = client.get("/admin/prices/new", query_string={"from": base_id})
    assert response.status_code == 200


@PROFILE
@given(days, days, ids, st.sampled_from(["", "message_received", "x"]))
def test_audit_search_and_dashboards_never_500(admin, since, until, before, event_type):
    counted()
    args = {"since": since, "until": until, "before": before, "type": event_type}
    response = admin["fuzz-auditor"].get("/admin/audit", query_string=args)
    assert response.status_code in {200, 400}, (since, until, response.status_code)
    for path in ("/admin/dashboard", "/admin/api/spend"):
        response = admin["fuzz-admin"].get(path, query_string=args)
        assert response.status_code in {200, 400}, (path, since, until, response.status_code)


# -- the admin filters on PostgreSQL ------------------------------------------------------------------
# A department id is a filter in the dashboards and /admin/api/spend, the finance export, the
# knowledge base's test box and uploads, and a budget's scope: each reaches SQL, where
# PostgreSQL (not SQLite) refuses a NUL byte in text and a number beyond bigint, so these
# cases run there.
departments = st.one_of(
    st.integers(-10, 10**40).map(str), st.text(max_size=12),
    st.lists(st.integers(-5, 10**31), max_size=4).map(lambda ids: ",".join(map(str, ids))),
    st.sampled_from(["", "7", " 7 ", "\x00", "7\x00", "١٢", "4294967295", "4294967296", "1_0", "+7",
                     "9" * 30, "7,,8", "7, 8"]))
PROFILE_PG = settings(PROFILE, max_examples=max(PROFILE.max_examples // 4, 20))


@pytest.fixture(scope="module")
def pg_admin(env, tmp_path_factory):
    from app.knowledge.store import KnowledgeStore
    from app.web.admin.accounts import create_user
    from tests.app.web.admin.conftest import csrf_token, login
    from tests.support.stack import TempDatabase

    database = TempDatabase("postgres", tmp_path_factory.mktemp("fuzz-pg"))
    try:
        migrate.upgrade(database.url)
        services = Services(settings_from({**env, "DATABASE_URL": database.url}, session_cookie_secure=False))
        KnowledgeStore(services).add("# 财务 Finance\n\n## 年假\n\n年假 10 天。\n".encode(), "财务制度",
                                     departments=[7])
        app = create_app(services=services)
        app.config["TESTING"] = True
        clients = {}
        with services.db.transaction() as session:
            for name, role in (("pg-admin", "admin"), ("pg-finance", "finance")):
                create_user(session, name, role, "correct horse battery")
        for name in ("pg-admin", "pg-finance"):
            clients[name] = client = app.test_client()
            assert login(client, name, "correct horse battery").status_code == 302
            client.token = csrf_token(client, "/admin/login")
        yield clients
        services.db.dispose()
    finally:
        database.drop()


@PROFILE_PG
@given(departments)
def test_department_filters_and_ids_never_500_on_postgresql(pg_admin, department):
    counted()
    admin, finance = pg_admin["pg-admin"], pg_admin["pg-finance"]
    for path in ("/admin/dashboard", "/admin/api/spend"):
        response = admin.get(path, query_string={"department": department})
        assert response.status_code in {200, 400}, (path, department, response.status_code)
    response = finance.post("/admin/finance/export", data={"department": department, "granularity": "day",
                                                           "csrf_token": finance.token})
    assert response.status_code in {200, 302}, (department, response.status_code)
    response = admin.post("/admin/knowledge/search", data={"question": "年假", "departments": department,
                                                           "csrf_token": admin.token})
    assert response.status_code in {200, 400}, (department, response.status_code)
    response = admin.post("/admin/budgets/new", data={
        "scope": "department", "scope_value": department, "period": "month", "limit": "10",
        "action": "warn", "thresholds": "50,100", "enabled": "y", "csrf_token": admin.token})
    assert response.status_code in {200, 302, 400}, (department, response.status_code)


def test_the_suite_ran_ten_thousand_cases():
    """Counted over this module's fuzz tests when all of them ran (the whole file, in order)."""
    fuzz_tests = [name for name, value in globals().items()
                  if name.startswith("test_") and hasattr(value, "hypothesis")]
    if set(CASES) != set(fuzz_tests):
        pytest.skip(f"only {len(CASES)} of {len(fuzz_tests)} fuzz tests ran")
    if PROFILE.max_examples >= 520:
        assert sum(CASES.values()) >= 10_000, CASES
