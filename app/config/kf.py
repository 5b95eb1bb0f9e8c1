"""The 微信客服 (WeCom customer service, "kf") channel: who takes over from the bot, and the
channel's own token budget (docs/kf.md)."""

from __future__ import annotations

from pydantic import Field, field_validator

from app.config.base import SettingsGroup, blank_is_unset

KF_PERIODS = ("day", "week", "month")


class KfSettings(SettingsGroup):
    kf_enabled: bool = Field(default=False, description="answer kf_msg_or_event callbacks (微信客服)")
    kf_servicer_userid: str | None = Field(
        default=None, description="the member a customer is handed to (kf/service_state/trans, "
                                  "state 3); unset: the customer goes to the kf account's queue (state 2)")
    kf_sync_limit: int = Field(default=1000, ge=1, le=1000, description="kf/sync_msg's page size")
    kf_budget_tokens: int = Field(default=0, ge=0, description="tokens the kf channel may use a "
                                 "KF_BUDGET_PERIOD (0 = unlimited); over it a customer is handed to a human")
    kf_budget_period: str = Field(default="day", pattern="^(day|week|month)$")
    kf_handover_words: str = Field(default="转人工,人工客服,人工服务,找人工,真人客服,human agent,talk to a human,real person",
                                   description="comma-separated: a customer message holding one asks for a human")

    @field_validator("kf_servicer_userid", mode="before")
    @classmethod
    def _blank(cls, value):
        return blank_is_unset(value)

    @property
    def kf_handover_terms(self) -> tuple[str, ...]:
        return tuple(w.strip().lower() for w in self.kf_handover_words.split(",") if w.strip())
