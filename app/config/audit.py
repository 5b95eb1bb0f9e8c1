"""The audit log (app/audit/chain.py): retention, checkpoints, the head's outside copy, export signing."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator

from app.config.base import SettingsGroup, blank_is_unset
from app.config.secret_fields import SIGNING_KEY


class AuditSettings(SettingsGroup):
    audit_retention_days: int = Field(default=180, description="never below 180 (6 months)")
    audit_checkpoint_minutes: int = Field(
        default=60, ge=0, le=1440,
        description="the beat seals a checkpoint event this often; 'audit verify' reports a "
                    "head sealed more than twice this long ago (a cut tail); 0 = neither")
    audit_stale_minutes: int = Field(
        default=0, ge=0, le=7 * 24 * 60,
        description="'audit verify' reports a chain head, or its outside copy, not resealed for "
                    "longer than this (an old head put back, checkpoints or copies stopped); "
                    "0 = twice AUDIT_CHECKPOINT_MINUTES; must exceed AUDIT_CHECKPOINT_MINUTES")
    audit_head_file: str | None = Field(
        default=None, description="a copy of the chain head outside the database, compared by "
                                  "'audit verify' (a path the database's users cannot write)")
    audit_export_key: Annotated[SecretStr | None, SIGNING_KEY] = Field(
        default=None, description="Ed25519 key signing exports: PKCS#8 PEM, or base64 of the "
                                  "32-byte seed ('audit public-key' prints the public half)")
    audit_export_key_file: str | None = Field(default=None, description="or a PEM file of it")

    @field_validator("audit_head_file", "audit_export_key", "audit_export_key_file", mode="before")
    @classmethod
    def _audit_blank_is_unset(cls, value):
        return blank_is_unset(value)

    @model_validator(mode="after")
    def _stale_after_a_checkpoint(self):
        if self.audit_stale_minutes and self.audit_stale_minutes <= self.audit_checkpoint_minutes:
            raise ValueError(f"AUDIT_STALE_MINUTES ({self.audit_stale_minutes}) must exceed "
                             f"AUDIT_CHECKPOINT_MINUTES ({self.audit_checkpoint_minutes}): a "
                             "healthy head is resealed only every checkpoint")
        return self

    @field_validator("audit_retention_days")
    @classmethod
    def _retention_at_least_six_months(cls, value: int) -> int:
        if value < 180:
            raise ValueError("must be at least 180 days (the audit log is kept at least 6 months)")
        return value
