"""Logs and metrics (docs/observability.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator

from app.config.base import SettingsGroup
from app.config.secret_fields import SHARED


class ObservabilitySettings(SettingsGroup):
    log_format: Literal["json", "text"] = Field(default="json", description="text for development")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    metrics_token: Annotated[SecretStr, SHARED] = Field(
        default=SecretStr(""), description="bearer token for /metrics from non-loopback")
    metrics_port: int = Field(default=0, ge=0, le=65535, description="worker metrics port, 0 = off")
    metrics_addr: str = Field(default="127.0.0.1", description="worker metrics bind address")

    @field_validator("log_format", mode="before")
    @classmethod
    def _format_lower(cls, value):
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_upper(cls, value):
        return value.strip().upper() if isinstance(value, str) else value
