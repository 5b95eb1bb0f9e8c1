"""The worker: conversations, claiming and sweeping messages, retries, what it says first."""

from __future__ import annotations

from pydantic import Field, field_validator

from app.config.base import SettingsGroup
from app.config.values import parse_rate


class WorkerSettings(SettingsGroup):
    conversation_ttl_s: int = 24 * 3600
    conversation_max_messages: int = 20
    claim_lease_s: float = 30.0
    sweep_interval_s: float = 30.0
    sweep_queued_after_s: float = 60.0
    task_max_retries: int = 5
    worker_heartbeat_ttl_s: float = Field(default=30.0, ge=3, description="see worker/observability/heartbeat.py")
    # A 👍/👎 template card after each model answer on the app channel, and WeCom's own 👍/👎
    # under the AI bot's answers (feedback.id on the first stream reply): app.feedback.ratings.
    feedback_cards: bool = True
    # An app answer with Markdown goes as WeCom's markdown message (headings, bold, links, inline
    # code, quotes; lists and tables rewritten as text: app/wecom/markdown.py); false: always a
    # text message with the markup taken out (members who read the app in the WeChat plugin,
    # 微信插件, which shows no markdown message).
    wecom_markdown: bool = True
    welcome_message: str = "你好，我是公司的 AI 助手，有问题随时问我。Hi, I'm the company assistant."
    wecom_user_rate_limit: str = Field(default="20/min", description="per WeCom user; 0 = off")
    department_cache_s: int = Field(
        default=300, ge=0, description="a user's departments, from WeCom's directory, are cached this "
                                       "long (WeCom's change_contact events drop an entry at once)")

    @field_validator("wecom_user_rate_limit")
    @classmethod
    def _user_rate_parses(cls, value: str) -> str:
        parse_rate(value)
        return value

    @property
    def user_rate_limit(self) -> tuple[int, int]:
        return parse_rate(self.wecom_user_rate_limit)
