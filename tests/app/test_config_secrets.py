"""Secret settings: marked, redacted from every log line, checked for strength.

The logs' redaction list is derived from the settings' markers (``app.config.secret_fields``):
these tests walk the settings, so a secret setting without a marker (by its name or its type),
or a marked one whose values do not reach the list, fails here.
"""

from __future__ import annotations

import base64
import io
import logging
import re
import secrets

import pytest

from app import logging_setup
from app.config import ConfigError, Settings, load_settings, secret_fields, secret_values
from app.config.secret_fields import (
    AES_KEY,
    BLIND_INDEX,
    KEYRING,
    PREVIOUS_KEYS,
    RANDOM,
    SHARED,
    SIGNING_KEY,
    URL,
    is_pattern,
)
from app.config.siem import HEADERS
from scripts.dev_env import random_aes_key
from tests.support.env import make_env

SECRET_WORDS = {"token", "key", "keys", "secret", "password", "passwd"}
# The secrets named in issue 50: dropping any one of them from the list must fail a test.
NAMED = ("wecom_token", "wecom_aes_key", "secret_key", "blind_index_keys", "openai_api_key",
         "previous_secret_keys", "aibot_secret", "audit_export_key")


def says_secret(name: str) -> bool:
    """A setting whose name says it holds a secret (``..._file``: a path to one, not one;
    ``..._per_key``: a number counted for each API key, not one)."""
    words = name.split("_")
    named = {word for i, word in enumerate(words) if i == 0 or words[i - 1] != "per"}
    return bool(SECRET_WORDS & named) and words[-1] != "file"


def test_every_setting_whose_name_says_secret_is_marked():
    marked = secret_fields(Settings)
    unmarked = [name for name in Settings.model_fields if says_secret(name) and name not in marked]
    assert unmarked == []
    # The names of the issue, properties included (they read a marked setting's keyring).
    attributes = {m.attribute for m in marked.values() if m.attribute}
    assert [n for n in NAMED if n not in marked and n not in attributes] == []


def test_every_secret_typed_setting_is_marked_and_every_marked_one_hides_its_value():
    marked = secret_fields(Settings)
    for name, field in Settings.model_fields.items():
        typed_secret = "SecretStr" in str(field.annotation)
        if typed_secret:
            assert name in marked, f"{name} is a SecretStr without a secret marker"
        elif name in marked:
            assert marked[name] is URL, f"{name} is marked secret but its repr shows it"


def test_every_url_setting_is_marked_for_its_password():
    marked = secret_fields(Settings)
    urls = [name for name in Settings.model_fields if name.endswith(("_url", "_base"))]
    assert len(urls) >= 12
    assert [name for name in urls if marked.get(name) is not URL] == []


# -- every marked value reaches the redaction list ----------------------------------------------------
def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def sentinel_env() -> tuple[dict[str, str], dict[str, list[str]]]:
    """An environment with every marked setting set to a fresh valid value, and for each the
    values no log line may show (the keys inside a ring, a URL's password)."""
    env = make_env(DATABASE_URL="postgresql+psycopg://bot@127.0.0.1:5432/bot")
    expected: dict[str, list[str]] = {}
    for name, marker in secret_fields(Settings).items():
        if marker is SHARED:
            value = "SENTINEL" + secrets.token_urlsafe(24)
            hidden = [value]
        elif marker is RANDOM:
            value = secrets.token_urlsafe(48)
            hidden = [value]
        elif marker in (BLIND_INDEX, PREVIOUS_KEYS):
            hidden = [secrets.token_urlsafe(48), secrets.token_urlsafe(48)]
            value = ",".join(hidden)
        elif marker is KEYRING:
            hidden = [b64(secrets.token_bytes(32)), b64(secrets.token_bytes(32))]
            value = f"k2:{hidden[0]},k1:{hidden[1]}"
        elif marker is AES_KEY:
            value = random_aes_key()
            hidden = [value]
        elif marker is SIGNING_KEY:
            value = b64(secrets.token_bytes(32))
            hidden = [value]
        elif marker is URL:
            password = "pw" + secrets.token_hex(8)
            hidden = [password]
            if name == "database_url":
                value = f"postgresql+psycopg://bot:{password}@127.0.0.1:5432/bot"
            elif name == "database_replica_url":
                value = f"postgresql+psycopg://reader:{password}@127.0.0.2:5432/bot"
            elif name == "redis_url":
                value = f"redis://:{password}@127.0.0.1:6379/0"
            elif name == "celery_broker_url":
                value = f"amqp://bot:{password}@127.0.0.1:5672//"
            elif name == "aibot_ws_url":  # wss:// only, outside loopback
                value = f"wss://bot:{password}@openws.example.test/"
            elif name == "alert_webhook_url":  # a WeCom group robot: the key is the secret
                value = f"https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key={password}"
            elif name == "siem_syslog_url":
                value = f"tls://svc:{password}@siem.example.test:6514"
            else:
                value = f"https://svc:{password}@{name.replace('_', '-')}.example.test/v1"
        elif marker is HEADERS:  # a collector's token in SIEM_OTLP_HEADERS
            hidden = [f"Bearer {secrets.token_urlsafe(24)}", secrets.token_urlsafe(16)]
            value = f"Authorization={hidden[0]},X-Scope-Token={hidden[1]}"
        else:
            raise AssertionError(f"{name}: a marker this test cannot make a value for")
        env[name.upper()] = value
        expected[name] = hidden
    return env, expected


def test_every_marked_setting_reaches_the_redaction_list_and_no_log_line():
    env, expected = sentinel_env()
    settings = load_settings(_env_file=None, **{k.lower(): v for k, v in env.items()})
    listed = set(secret_values(settings))
    missing = {name: values for name, values in expected.items() if not set(values) <= listed}
    assert missing == {}
    for name in NAMED:  # including the keyrings' properties
        value = getattr(settings, name)
        values = value if isinstance(value, list) else [value.get_secret_value()]
        assert set(values) <= listed, name

    stream = io.StringIO()
    handler = logging_setup.configure(settings, stream=stream)
    try:
        log = logging.getLogger("app.test.secrets")
        for name, values in expected.items():
            for value in values:
                log.warning("setting %s is %s", name, value)
                log.warning("embedded:%s:", value)
    finally:
        logging.getLogger().removeHandler(handler)
    out = stream.getvalue()
    leaked = [name for name, values in expected.items() if any(v in out for v in values)]
    assert leaked == [] and out.count(logging_setup.REDACTED) >= 2 * len(expected)


# -- strength -------------------------------------------------------------------------------------------
CHECKED = sorted(name.upper() for name, marker in secret_fields(Settings).items()
                 if marker.check is not None)
WEAK = {"too short": "Zq9", "a pattern": "ab" * 24, "a placeholder": "change-me-" + "q1w2e3r4" * 4}


def test_the_issues_probes_are_among_the_checked():
    assert {"METRICS_TOKEN", "AIBOT_SECRET", "ASR_API_KEY", "VISION_API_KEY",
            "EMBEDDINGS_API_KEY", "RERANK_API_KEY", "SECRET_KEY_PREVIOUS"} <= set(CHECKED)


@pytest.mark.parametrize("weakness", WEAK)
@pytest.mark.parametrize("name", CHECKED)
def test_a_weak_secret_is_refused_naming_the_variable_not_the_value(name, weakness):
    value = WEAK[weakness]
    with pytest.raises(ConfigError) as info:
        load_settings(_env_file=None, **{k.lower(): v for k, v in make_env(**{name: value}).items()})
    message = str(info.value)
    assert name in message and value not in message
    assert re.findall(r"(?:^invalid configuration: |; )([A-Z][A-Z0-9_]+) ", message) == [name]


@pytest.mark.parametrize("make", [lambda: secrets.token_urlsafe(12), lambda: secrets.token_urlsafe(32),
                                  lambda: secrets.token_hex(16),
                                  lambda: "".join(secrets.choice("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghij"
                                                                 "kmnpqrstuvwxyz23456789")
                                                  for _ in range(32))])
def test_random_shared_secrets_in_the_usual_shapes_pass(make):
    """16+ characters from token_urlsafe, token_hex, or a console's 32 letters and digits."""
    for _ in range(500):
        value = make()
        assert not is_pattern(value), value


@pytest.mark.parametrize("value", ["aaaaaaaaaaaaaaaaaaaa", "abcabcabcabcabcabcabc", "abcdefabcdefabcdefab",
                                   "abcdefghijklmnopqrst", "1234567890123456", "zyxwvutsrqponmlkjihg",
                                   "112233445566778899"])
def test_patterns_are_recognised(value):
    assert is_pattern(value)


def test_an_unset_optional_secret_is_off_but_a_required_one_is_an_error():
    settings = load_settings(_env_file=None, **{k.lower(): v for k, v in make_env(
        METRICS_TOKEN="", OPENAI_API_KEY="   ", AUDIT_EXPORT_KEY="", AIBOT_SECRET="").items()})
    assert settings.metrics_token.get_secret_value() == "" and settings.aibot_secret is None
    with pytest.raises(ConfigError, match="WECOM_SECRET must not be empty"):
        load_settings(_env_file=None, **{k.lower(): v for k, v in make_env(WECOM_SECRET=" ").items()})


def test_an_export_key_of_a_constant_seed_is_refused():
    with pytest.raises(ConfigError, match="AUDIT_EXPORT_KEY is not random"):
        load_settings(_env_file=None, **{k.lower(): v for k, v in make_env(
            AUDIT_EXPORT_KEY=b64(bytes(32))).items()})


def test_earlier_secret_keys_need_the_length_secret_key_always_had():
    older = secrets.token_urlsafe(24)  # 32 characters: an earlier SECRET_KEY could be this
    settings = load_settings(_env_file=None, **{k.lower(): v for k, v in make_env(
        SECRET_KEY_PREVIOUS=f"{secrets.token_urlsafe(48)}, {older}").items()})
    assert settings.previous_secret_keys[1] == older
    with pytest.raises(ConfigError, match="SECRET_KEY_PREVIOUS key 2 is too short"):
        load_settings(_env_file=None, **{k.lower(): v for k, v in make_env(
            SECRET_KEY_PREVIOUS=f"{secrets.token_urlsafe(48)},{secrets.token_urlsafe(12)}").items()})
