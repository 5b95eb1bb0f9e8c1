"""Tools over MCP (app/tools, worker/tools, docs/tools.md): whether the worker offers them, the
key that signs the asker's identity for a tool server, and the bounds of one tool loop."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator

from app.config.base import SettingsGroup, blank_is_unset
from app.config.secret_fields import SIGNING_KEY

PLANNERS = ("model", "intent")


class ToolSettings(SettingsGroup):
    tools_enabled: bool = Field(default=False, description="offer the registered MCP tools to the "
                                                           "model (python -m app.cli tools add)")
    tools_signing_key: Annotated[SecretStr | None, SIGNING_KEY] = Field(
        default=None, description="Ed25519 key signing the asker's identity token a tool server "
                                  "checks: PKCS#8 PEM or base64 of the 32-byte seed")
    tools_signing_key_file: str | None = Field(default=None, description="or a PEM file of it")
    tools_identity_issuer: str = Field(default="wecom-bot", min_length=1, max_length=64,
                                    description="the token's iss; a server checks it")
    tools_identity_ttl_s: int = Field(default=60, ge=10, le=300, description="identity token lifetime")
    tools_max_steps: int = Field(default=4, ge=1, le=10, description="model turns in one tool loop")
    tools_max_seconds: float = Field(default=60.0, ge=5, le=600, description="one tool loop's time")
    tools_max_tokens: int = Field(default=4096, ge=256, le=200_000,
                                  description="tokens one tool loop may spend (prompt and completion)")
    tools_call_timeout_s: float = Field(default=10.0, ge=1, le=120, description="one tool call")
    tools_result_max_chars: int = Field(default=4000, ge=200, le=100_000,
                                        description="a longer tool result is cut to this")
    tools_list_ttl_s: int = Field(default=300, ge=10, le=86_400,
                                  description="how long a server's tool list is cached in Redis")
    tools_confirm_ttl_s: int = Field(default=300, ge=30, le=3600,
                                     description="how long a side effect's confirmation stays open")
    tools_planner: str = Field(default="model", description="model: the model chooses the call; "
                                                            "intent: the demo's keyword router")

    @field_validator("tools_signing_key", "tools_signing_key_file", mode="before")
    @classmethod
    def _tools_blank_is_unset(cls, value):
        return blank_is_unset(value)

    @field_validator("tools_planner")
    @classmethod
    def _known_planner(cls, value: str) -> str:
        if value not in PLANNERS:
            raise ValueError(f"must be one of {', '.join(PLANNERS)}")
        return value

    @model_validator(mode="after")
    def _tools_need_a_key(self):
        if self.tools_enabled and self.tools_signing_key is None and not self.tools_signing_key_file:
            raise ValueError("TOOLS_ENABLED needs TOOLS_SIGNING_KEY or TOOLS_SIGNING_KEY_FILE: every "
                             "tool call carries the asker's signed identity")
        return self
