"""WeCom's two channels: the app (callback + ``message/send``) and the AI bot (智能机器人)."""

from __future__ import annotations

import ipaddress
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from app.config.base import SettingsGroup, blank_is_unset
from app.config.secret_fields import AES_KEY, SHARED, URL


class WeComSettings(SettingsGroup):
    """The app channel: the callback's token and key, the API's corp id, agent and secret."""

    wecom_corp_id: str = Field(min_length=1)
    wecom_agent_id: int
    wecom_secret: Annotated[SecretStr, SHARED]
    wecom_token: Annotated[SecretStr, SHARED]
    wecom_aes_key: Annotated[SecretStr, AES_KEY]
    wecom_api_base: Annotated[str, URL] = "https://qyapi.weixin.qq.com"
    # WeCom's duplicate check on every reply chunk: a retried send whose first answer was lost
    # (a timeout) is not delivered twice. The same reply to the same user within this window is
    # dropped by WeCom too, so it only needs to span the retries (1..14400 s).
    wecom_duplicate_check_s: int = Field(default=900, ge=1, le=14400)
    # 45009 (WeCom's frequency limit, counted per minute and per hour): the first retry waits
    # this long, each further one twice as long, at most 300 s (worker/retry_policy.py).
    wecom_rate_limit_retry_s: float = Field(default=60.0, ge=1, le=300)


class AiBotSettings(SettingsGroup):
    """The AI bot: its callback (/wecom/aibot, off unless token and key are both set) and its
    long connection (python -m app.web.aibot_connection, docs/aibot.md: the bot dials out over a
    WebSocket, no public URL; off unless the bot id and secret are both set)."""

    aibot_token: Annotated[SecretStr | None, SHARED] = None
    aibot_encoding_aes_key: Annotated[SecretStr | None, AES_KEY] = None
    aibot_name: str = Field(default="", description="the bot's name, to see @mentions in groups")
    aibot_stream_deadline_s: float = Field(default=330.0, ge=10, le=345,
                                           description="finish a stream before WeCom's 6 minutes")
    aibot_stream_ttl_s: int = Field(default=900, ge=360)
    aibot_refresh_throttle_s: float = Field(default=0.2, ge=0, le=5)
    aibot_thinking_text: str = ""
    aibot_bot_id: str = ""
    aibot_secret: Annotated[SecretStr | None, SHARED] = None
    aibot_ws_url: Annotated[str, URL] = Field(
        default="wss://openws.work.weixin.qq.com",
        description="WeCom's long-connection endpoint (the emulator's in dev)")
    aibot_ws_heartbeat_s: float = Field(default=30.0, gt=0, le=120)
    aibot_ws_lease_s: float = Field(default=5.0, ge=1, le=60,
                                    description="the Redis lease a connection holder renews")
    aibot_ws_backoff_max_s: float = Field(default=30.0, ge=1, le=600)

    @field_validator("aibot_token", "aibot_encoding_aes_key", "aibot_secret", mode="before")
    @classmethod
    def _aibot_blank_is_unset(cls, value):
        return blank_is_unset(value)

    @model_validator(mode="after")
    def _aibot_needs_both(self):
        if (self.aibot_token is None) != (self.aibot_encoding_aes_key is None):
            raise ValueError("AIBOT_TOKEN and AIBOT_ENCODING_AES_KEY must be set together "
                             "(or neither, to turn the AI bot channel off)")
        return self

    @field_validator("aibot_ws_url")
    @classmethod
    def _aibot_ws_encrypted(cls, value: str) -> str:
        # The subscription carries AIBOT_SECRET and every message: in clear over ws:// anyone
        # on the path reads them. Plain ws:// only to this machine (the emulator in dev).
        parts = urlsplit(value.strip())
        if parts.scheme == "wss" and parts.hostname:
            return value.strip()
        if parts.scheme == "ws" and is_loopback_host(parts.hostname or ""):
            return value.strip()
        raise ValueError("must be a wss:// URL (plain ws:// only to a loopback address such as "
                         "ws://127.0.0.1:8082, the emulator): the bot's secret and messages "
                         "would cross the network in clear")

    @property
    def aibot_enabled(self) -> bool:
        return self.aibot_token is not None and self.aibot_encoding_aes_key is not None

    @property
    def aibot_ws_enabled(self) -> bool:
        """The long connection: a bot id and its secret (the callback's token and key not needed)."""
        return bool(self.aibot_bot_id.strip()) and self.aibot_secret is not None


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
