"""Environment values for tests: valid random secrets, the settings built from them, and the
Redis server the tests use.

``TEST_REDIS`` (default ``redis://127.0.0.1:6379``) names that server: every test builds its
Redis URLs with ``redis_url(db)``, so a run can be pointed at a Redis of its own and never touches
the databases of a ``make run`` stack (which uses database 0) or of another run.
"""

from __future__ import annotations

import os

from scripts.dev_env import dev_env

TEST_REDIS = os.environ.get("TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")


def redis_url(db: int) -> str:
    """The test Redis server's database ``db``; 0 is left to a running ``make run`` stack."""
    if not 1 <= int(db) <= 15:
        raise ValueError(f"tests use Redis databases 1-15 (0 belongs to make run), not {db}")
    return f"{TEST_REDIS}/{db}"


def make_env(**overrides: str) -> dict[str, str]:
    env = dev_env()
    env.update({"DATABASE_URL": "sqlite:///:memory:", "REDIS_URL": redis_url(15)})
    env.update(overrides)
    return env


def settings_from(env: dict[str, str], **overrides):
    from app.config import load_settings

    values = {k.lower(): v for k, v in env.items()}
    values.update(overrides)
    return load_settings(_env_file=None, **values)
