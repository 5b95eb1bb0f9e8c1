"""Settings, read once from the environment (or `.env`, or files in ``SECRETS_DIR``).

One small class a concern, each in its module, composed into ``Settings`` by inheritance, so
every setting keeps its flat name: ``settings.wecom_token`` reads ``WECOM_TOKEN``, as before.

- ``wecom``: the app channel (``WeComSettings``) and the AI bot (``AiBotSettings``);
- ``storage``: the database (``DatabaseSettings``), Redis and the broker (``QueueSettings``);
- ``protection``: data keys, blind-index keys, the server secret (``DataProtectionSettings``);
- ``web``: requests and the intake (``WebSettings``), the /v1 API (``ApiSettings``), the admin
  site (``AdminSettings``); ``worker``: the message path's worker (``WorkerSettings``);
- ``audit`` (``AuditSettings``), ``accounting`` (``AccountingSettings``: budgets and alerts),
  ``observability`` (``ObservabilitySettings``: logs, metrics);
- ``kf``: the 微信客服 channel (``KfSettings``);
- ``siem``: audit events and spend streamed to the SIEM (``SiemSettings``: syslog, OTLP);
- ``tools``: MCP tools, their identity tokens and the tool loop's bounds (``ToolSettings``);
- ``sso``: WeCom sign-in for the admin site (``WeComLoginSettings``);
- ``inference``: the model (``ModelSettings``, ``OpenAISettings``); ``knowledge``: the
  knowledge base and its servers; ``media``: voice, images and files (``MediaSettings``);
- ``secret_fields``: which settings are secrets, their strength rules, the logs' redaction list;
  ``base``: what every group shares; ``values``: thresholds and rates.

A missing or malformed setting must stop start-up with a message that names the variable, so
``load_settings`` turns pydantic's validation errors into one ``ConfigError`` listing them.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import ValidationError

from app.config.accounting import AccountingSettings
from app.config.audit import AuditSettings
from app.config.inference import ModelSettings, OpenAISettings
from app.config.kf import KfSettings
from app.config.knowledge import KnowledgeServerSettings, KnowledgeSettings
from app.config.media import MediaSettings
from app.config.observability import ObservabilitySettings
from app.config.protection import DataProtectionSettings
from app.config.secret_fields import (
    GENERATE_HINT,
    MIN_SECRET_BYTES,
    PLACEHOLDER_WORDS,
    decode_random_secret,
    parse_keyring,
    refuse_low_entropy,
    refuse_placeholder,
    secret_fields,
    secret_values,
    split_blind_index_keys,
)
from app.config.siem import SiemSettings
from app.config.sso import WeComLoginSettings
from app.config.storage import DatabaseSettings, QueueSettings
from app.config.tools import ToolSettings
from app.config.values import RATE_UNITS, parse_rate, parse_thresholds
from app.config.web import AdminSettings, ApiSettings, WebSettings
from app.config.wecom import AiBotSettings, WeComSettings
from app.config.worker import WorkerSettings


class ConfigError(RuntimeError):
    """The environment does not describe a runnable service."""


class Settings(
    WeComSettings, AiBotSettings, DatabaseSettings, QueueSettings, DataProtectionSettings,
    WebSettings, ApiSettings, AdminSettings, WorkerSettings, AuditSettings, AccountingSettings,
    ObservabilitySettings, ModelSettings, OpenAISettings, KnowledgeSettings,
    KnowledgeServerSettings, MediaSettings, SiemSettings, KfSettings, ToolSettings,
    WeComLoginSettings,
):
    """Every setting of the service: the groups above, one flat namespace."""


def load_settings(**overrides) -> Settings:
    """Build the settings or raise ``ConfigError`` naming every bad variable."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = "_".join(str(p) for p in err["loc"]).upper() or "SETTINGS"
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "missing":
                message = "is not set"
            problems.append(f"{name} {message}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (tests build their own with ``load_settings``)."""
    return load_settings()


__all__ = [
    "GENERATE_HINT", "MIN_SECRET_BYTES", "PLACEHOLDER_WORDS", "RATE_UNITS", "AccountingSettings",
    "AdminSettings", "AiBotSettings", "ApiSettings", "AuditSettings", "ConfigError",
    "DataProtectionSettings", "DatabaseSettings", "KfSettings", "KnowledgeServerSettings", "KnowledgeSettings",
    "MediaSettings", "ModelSettings", "ObservabilitySettings", "OpenAISettings", "QueueSettings",
    "Settings", "SiemSettings", "WeComSettings", "WebSettings", "WorkerSettings", "decode_random_secret",
    "get_settings", "load_settings", "parse_keyring", "parse_rate", "parse_thresholds",
    "refuse_low_entropy", "refuse_placeholder", "secret_fields", "secret_values",
    "split_blind_index_keys",
]
