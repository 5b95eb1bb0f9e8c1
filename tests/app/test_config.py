import pytest

from app.config import ConfigError, load_settings, parse_keyring
from tests.support.env import make_env


@pytest.fixture
def clean_env(monkeypatch):
    for key in make_env():
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir("/")  # no stray .env
    return monkeypatch


def apply(monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_valid_environment_loads(clean_env):
    env = make_env()
    apply(clean_env, env)
    settings = load_settings()
    assert settings.wecom_corp_id == env["WECOM_CORP_ID"]
    assert settings.celery_broker_url == env["REDIS_URL"]
    assert list(settings.keyring) == ["k1"]


@pytest.mark.parametrize("name", ["WECOM_CORP_ID", "WECOM_SECRET", "WECOM_TOKEN", "WECOM_AES_KEY",
                                  "WECOM_AGENT_ID", "DATA_KEYS", "BLIND_INDEX_KEY", "SECRET_KEY"])
def test_missing_secret_names_the_variable(clean_env, name):
    env = make_env()
    env.pop(name)
    apply(clean_env, env)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert name in str(info.value) and "is not set" in str(info.value)


@pytest.mark.parametrize("value, words", [("short", "43-character"), ("!" * 43, "not a valid")])
def test_malformed_aes_key_names_the_variable(clean_env, value, words):
    apply(clean_env, make_env(WECOM_AES_KEY=value))
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "WECOM_AES_KEY" in str(info.value) and words in str(info.value)


def test_secret_values_never_appear_in_errors(clean_env):
    env = make_env(WECOM_AES_KEY="s3cr3t-but-too-short")
    apply(clean_env, env)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "s3cr3t" not in str(info.value)


def test_repr_hides_secrets(clean_env):
    env = make_env()
    apply(clean_env, env)
    text = repr(load_settings())
    for name in ("WECOM_SECRET", "WECOM_TOKEN", "WECOM_AES_KEY", "SECRET_KEY", "BLIND_INDEX_KEY"):
        assert env[name] not in text


def test_bad_keyring(clean_env):
    apply(clean_env, make_env(DATA_KEYS="k1:notbase64!!"))
    with pytest.raises(ConfigError, match="DATA_KEYS"):
        load_settings()


def test_keyring_order_and_duplicates():
    import base64
    import os

    a, b = (base64.b64encode(os.urandom(32)).decode() for _ in range(2))
    assert list(parse_keyring(f"new:{a},old:{b}")) == ["new", "old"]
    with pytest.raises(ValueError, match="twice"):
        parse_keyring(f"k:{a},k:{b}")
    with pytest.raises(ValueError, match="32 bytes"):
        parse_keyring("k:" + base64.b64encode(b"short").decode())


def test_secrets_dir(clean_env, tmp_path):
    env = make_env()
    secret = env.pop("WECOM_SECRET")
    (tmp_path / "wecom_secret").write_text(secret)
    apply(clean_env, env)
    from app.config import Settings

    settings = Settings(_secrets_dir=str(tmp_path))
    assert settings.wecom_secret.get_secret_value() == secret


# -- secrets must be random, not placeholders -------------------------------------------------------
OLD_EXAMPLE = {  # what .env.example shipped: each was accepted, and SECRET_KEY's forged admin sessions
    "SECRET_KEY": "replace-with-at-least-32-random-characters",
    "BLIND_INDEX_KEY": "replace-with-at-least-32-random-characters",
    "DATA_KEYS": "k1:REPLACE_WITH_BASE64_OF_32_RANDOM_BYTES",
    "WECOM_TOKEN": "change-me",
    "WECOM_SECRET": "change-me",
    "WECOM_AES_KEY": "0123456789abcdefghijklmnopqrstuvwxyzABCDEFG",
}
B64 = __import__("base64").b64encode


@pytest.mark.parametrize("name", OLD_EXAMPLE)
def test_the_old_examples_placeholders_are_refused(clean_env, name):
    apply(clean_env, make_env(**{name: OLD_EXAMPLE[name]}))
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert name in str(info.value) and OLD_EXAMPLE[name] not in str(info.value)


@pytest.mark.parametrize("name, value", [
    ("SECRET_KEY", "a" * 64),
    ("SECRET_KEY", "0123456789abcdef" * 4),  # hex of a repeating pattern
    ("SECRET_KEY", "the company bot's very long and memorable passphrase"),  # not encoded bytes
    ("SECRET_KEY", "c2VjcmV0" * 8),  # base64 of "secret" x 8
    ("SECRET_KEY", B64(b"0123456789abcdef" * 3).decode()),
    ("BLIND_INDEX_KEY", B64(b"\x00" * 48).decode()),
    ("BLIND_INDEX_KEY", "changeme" * 8),
    ("DATA_KEYS", "k1:" + B64(b"\x00" * 32).decode()),
    ("DATA_KEYS", "k1:" + B64(bytes(range(32))).decode() + ",k0:" + B64(b"ab" * 16).decode()),
    ("WECOM_AES_KEY", "A" * 43),
    ("WECOM_TOKEN", "your-token-here"),
    ("WECOM_SECRET", "put-your_secret-here"),
    ("AIBOT_TOKEN", "change-me"),
])
def test_low_entropy_or_placeholder_secrets_are_refused(clean_env, name, value):
    env = make_env(**{name: value})
    if name == "AIBOT_TOKEN":
        env["AIBOT_ENCODING_AES_KEY"] = make_env()["WECOM_AES_KEY"]
    apply(clean_env, env)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert name in str(info.value) and value not in str(info.value)


@pytest.mark.parametrize("make", [lambda s: s.token_urlsafe(48), lambda s: s.token_hex(32),
                                  lambda s: B64(s.token_bytes(32)).decode(),
                                  lambda s: B64(s.token_bytes(48)).decode().rstrip("=")])
def test_random_secrets_in_the_usual_encodings_load(clean_env, make):
    import secrets

    apply(clean_env, make_env(SECRET_KEY=make(secrets), BLIND_INDEX_KEY=make(secrets)))
    assert load_settings().secret_key


def test_the_dev_env_generator_always_makes_valid_secrets(clean_env):
    """make run's var/dev.env and every test's environment come from dev_env()."""
    from scripts.dev_env import dev_env

    for _ in range(300):
        load_settings(_env_file=None, **{k.lower(): v for k, v in dev_env().items()})


def test_env_example_ships_no_secret_values():
    from pathlib import Path

    example = (Path(__file__).parents[2] / ".env.example").read_text()
    values = dict(line.split("=", 1) for line in example.splitlines() if line and not line.startswith("#"))
    for name in ("WECOM_SECRET", "WECOM_TOKEN", "WECOM_AES_KEY", "DATA_KEYS", "BLIND_INDEX_KEY",
                 "SECRET_KEY", "POSTGRES_PASSWORD"):
        assert values[name] == "", name


@pytest.mark.parametrize("url", ["ws://openws.work.weixin.qq.com", "ws://10.0.0.5:8082",
                                 "http://127.0.0.1:8082", "wss://", "openws.work.weixin.qq.com"])
def test_the_ai_bot_long_connection_needs_wss_outside_loopback(clean_env, url):
    """AIBOT_SECRET and every message cross this connection: ws:// only to this machine."""
    apply(clean_env, make_env())
    with pytest.raises(ConfigError, match="AIBOT_WS_URL must be a wss:// URL"):
        load_settings(aibot_ws_url=url)


@pytest.mark.parametrize("url", ["wss://openws.work.weixin.qq.com", "wss://10.0.0.5:8443/ws",
                                 "ws://127.0.0.1:8082", "ws://localhost:8082", "ws://[::1]:8082"])
def test_wss_or_a_loopback_ws_url_is_accepted(clean_env, url):
    apply(clean_env, make_env())
    assert load_settings(aibot_ws_url=url).aibot_ws_url == url
