"""Environment values for tests: valid random secrets, and the settings built from them."""

from __future__ import annotations

from scripts.dev_env import dev_env


def make_env(**overrides: str) -> dict[str, str]:
    env = dev_env()
    env.update({"DATABASE_URL": "sqlite:///:memory:", "REDIS_URL": "redis://127.0.0.1:6379/15"})
    env.update(overrides)
    return env


def settings_from(env: dict[str, str], **overrides):
    from app.config import load_settings

    values = {k.lower(): v for k, v in env.items()}
    values.update(overrides)
    return load_settings(_env_file=None, **values)
