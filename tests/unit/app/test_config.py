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
