"""JSON log lines, the request id, and the redaction of secrets, user ids and message text."""

import io
import json
import logging

import pytest

from app import logging_setup
from tests.support import postgres
from tests.support.env import make_env, settings_from


@pytest.fixture
def env():
    return make_env(LOG_FORMAT="json", METRICS_TOKEN="metrics-secret-token-123")


@pytest.fixture
def capture(env):
    stream = io.StringIO()
    handler = logging_setup.configure(settings_from(env), stream=stream)
    yield stream
    logging.getLogger().removeHandler(handler)


def lines(stream) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_one_json_object_per_line_with_the_request_id(capture):
    log = logging.getLogger("app.test")
    with logging_setup.request_context("rid-123"):
        log.info("handled message_id=%s", 7, extra={"status": "answered", "attempt": 2})
    log.warning("outside")
    first, second = lines(capture)
    assert {"ts", "level", "logger", "msg", "request_id"} <= set(first)
    assert first["msg"] == "handled message_id=7" and first["logger"] == "app.test"
    assert first["request_id"] == "rid-123" and first["level"] == "INFO"
    assert first["status"] == "answered" and first["attempt"] == 2
    assert second["request_id"] is None and second["level"] == "WARNING"


def test_secrets_never_pass_in_messages_arguments_extras_or_tracebacks(capture, env):
    log = logging.getLogger("app.test")
    secret = env["WECOM_SECRET"]
    data_key = env["DATA_KEYS"].split(",")[0].partition(":")[2]
    log.info("calling gettoken corpsecret=%s", secret)
    log.info("url https://x/cgi-bin/message/send?access_token=AbCdEf123456&debug=1")
    log.info("header %s", "Authorization: Bearer sk-live-abcdef123456")
    log.info("keyring %s and token %s", data_key, "metrics-secret-token-123")
    log.info("with extras", extra={"content": "工资单", "user_id": "zhangsan", "api_key": "k"})
    try:
        raise RuntimeError(f"failed with {secret}")
    except RuntimeError:
        log.exception("boom")
    out = capture.getvalue()
    for leaked in (secret, "AbCdEf123456", "sk-live-abcdef123456", data_key,
                   "metrics-secret-token-123", "工资单", "zhangsan"):
        assert leaked not in out
    records = lines(capture)
    assert records[4]["content"] == logging_setup.REDACTED
    assert "RuntimeError" in records[5]["exc"] and logging_setup.REDACTED in records[5]["exc"]


def test_the_message_and_user_being_handled_are_masked_everywhere(capture):
    log = logging.getLogger("worker.test")
    with logging_setup.sensitive("lisi.wang", "我的工资是多少 SENTINEL"):
        log.info("model refused %r for %s", "我的工资是多少 SENTINEL", "lisi.wang")
        try:
            raise ValueError("prompt was 我的工资是多少 SENTINEL")
        except ValueError:
            log.exception("failed")
    log.info("after: lisi.wang is no longer registered")
    out = capture.getvalue()
    assert "SENTINEL" not in out and "我的工资" not in out
    assert lines(capture)[-1]["msg"] == "after: lisi.wang is no longer registered"


def test_other_handlers_see_the_redacted_record_too(capture, env, caplog):
    caplog.set_level(logging.INFO)
    logging.getLogger("app.test").info("secret %s", env["WECOM_SECRET"])
    assert env["WECOM_SECRET"] not in caplog.text and logging_setup.REDACTED in caplog.text


def test_text_format_for_development(env):
    stream = io.StringIO()
    handler = logging_setup.configure(settings_from(env, log_format="TEXT"), stream=stream)
    try:
        with logging_setup.request_context("rid-9"):
            logging.getLogger("app.dev").info("hello")
    finally:
        logging.getLogger().removeHandler(handler)
    line = stream.getvalue().strip()
    assert line.endswith("INFO app.dev [rid-9] hello") and not line.startswith("{")


@pytest.mark.parametrize("value, kept", [("abc-DEF_123", True), ("a" * 32, True), ("a" * 33, False),
                                         ("bad id", False), ("x\n{", False), ("", False)])
def test_incoming_request_ids_are_kept_only_when_plain(value, kept):
    assert (logging_setup.clean_request_id(value) == value) is kept


def test_bad_format_settings_are_refused(env):
    from app.config import ConfigError

    with pytest.raises(ConfigError, match="LOG_FORMAT"):
        settings_from(env, log_format="xml")
    with pytest.raises(ConfigError, match="WECOM_USER_RATE_LIMIT"):
        settings_from(env, wecom_user_rate_limit="lots")
    assert settings_from(env, wecom_user_rate_limit="5/hour").user_rate_limit == (5, 3600)
    assert settings_from(env, wecom_user_rate_limit="0").user_rate_limit == (0, 60)


def test_every_configured_secret_is_registered(env):
    """The AI bot's token and key, a previous SECRET_KEY and the passwords inside the database
    and Redis URLs are masked like the rest."""
    from scripts.dev_env import random_aes_key

    extra = {"AIBOT_TOKEN": "aibotTokenSentinel42", "AIBOT_ENCODING_AES_KEY": random_aes_key(),
             "DATABASE_URL": "postgresql+psycopg://bot:dbPassSentinel42@db:5432/bot",
             "REDIS_URL": "redis+sentinel://:redisPassSentinel42@s1:26379,s2:26379/mymaster/0"
                          "?sentinel_password=sentinelPassSentinel42",
             "CELERY_BROKER_URL": "redis://:brokerPassSentinel42@redis:6379/1"}
    stream = io.StringIO()
    handler = logging_setup.configure(settings_from({**env, **extra}), stream=stream)
    try:
        log = logging.getLogger("app.test")
        for value in (extra["AIBOT_TOKEN"], extra["AIBOT_ENCODING_AES_KEY"], "dbPassSentinel42",
                      "redisPassSentinel42", "brokerPassSentinel42", "sentinelPassSentinel42"):
            log.warning("leaking %s", value)
        out = stream.getvalue()
        assert "Sentinel42" not in out and extra["AIBOT_ENCODING_AES_KEY"] not in out
        assert out.count(logging_setup.REDACTED) == 6
    finally:
        logging.getLogger().removeHandler(handler)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_database_errors_carry_no_bound_parameters(kind):
    """A failed statement's message (logged with its traceback) names the SQL, never the values:
    those are ciphertexts, blind indexes, password hashes."""
    import sqlalchemy as sa

    from app.db import make_engine

    if kind == "postgresql":
        postgres.skip_if_opted_out()
    engine = make_engine("sqlite://" if kind == "sqlite" else postgres.SERVER)
    try:
        try:
            conn = engine.connect()  # apart from the failing statement: a refused connection is no pass
        except sa.exc.OperationalError as exc:
            postgres.unreachable(exc)
        with conn, pytest.raises(sa.exc.ProgrammingError if kind == "postgresql" else sa.exc.OperationalError) as info:
            conn.execute(sa.text("SELECT * FROM no_such_table WHERE x = :p"), {"p": "paramSentinel42"})
        assert "no_such_table" in str(info.value) and "paramSentinel42" not in str(info.value)
    finally:
        engine.dispose()
