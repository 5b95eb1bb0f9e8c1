"""What every group of settings shares: where values come from, and the secrets' check.

Each group (``app.config.wecom``, ``storage``, ...) is a ``SettingsGroup`` of the settings of one
concern; ``app.config.Settings`` inherits them all, so every field keeps its flat name: the
environment variable is the field's name in capitals (``WECOM_TOKEN`` -> ``wecom_token``), read
from the environment, ``.env`` or a file of that name in ``SECRETS_DIR``.
"""

from __future__ import annotations

import os

from pydantic import ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.config.secret_fields import check_strength


def blank_is_unset(value):
    """An optional setting given as "" (a compose file's ``${X:-}``) is not set."""
    return None if value is None or (isinstance(value, str) and not value.strip()) else value


class SettingsGroup(BaseSettings):
    model_config = SettingsConfigDict(
        env_file=".env", env_file_encoding="utf-8", extra="ignore",
        secrets_dir=os.environ.get("SECRETS_DIR") or None,
    )

    @field_validator("*")
    @classmethod
    def _secret_is_strong(cls, value, info: ValidationInfo):
        # Every setting passes; only those marked secret (app.config.secret_fields) are checked.
        return check_strength(cls, info.field_name, value)
