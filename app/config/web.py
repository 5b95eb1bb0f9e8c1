"""The web tier: requests and the callback intake, the OpenAI-compatible API, the admin site."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from app.config.base import SettingsGroup, blank_is_unset
from app.config.values import parse_rate


class WebSettings(SettingsGroup):
    """Requests, behind a reverse proxy (app/web/proxy.py), and the callback path."""

    web_role: Literal["all", "web", "api"] = Field(
        default="all",
        description="all: every route; web: the WeCom callbacks, admin and probes, not /v1; api: "
                    "/v1 and the probes only. Two gunicorns (web and api, as compose and make run "
                    "start them) keep a slow model's /v1 streams from holding the threads that "
                    "answer WeCom's callbacks")
    trusted_proxies: int = Field(default=0, ge=0, le=10,
                                 description="proxies in front whose X-Forwarded-* are believed; 0 = none")
    callback_max_bytes: int = 64 * 1024
    request_body_timeout_s: float = Field(
        default=10.0, gt=0, le=300,
        description="a request body (callback, /v1) must arrive whole within this: else 408 "
                    "(app/web/body_reader.py), so a client trickling one cannot hold a thread")
    callback_timestamp_window_s: int = 300
    # The intake server (app/web/intake_server.py) that gunicorn.conf.py runs writes every web
    # process's callbacks; its socket is set there. Unset: each web process writes its own.
    intake_socket: str | None = None
    intake_linger_ms: float = Field(
        default=1.0, ge=0, le=20,
        description="how long a batch of the intake server may wait for callbacks that busy "
                    "connections are about to send (a lone client never waits)")

    @field_validator("intake_socket", mode="before")
    @classmethod
    def _intake_blank_is_unset(cls, value):
        return blank_is_unset(value)


class ApiSettings(SettingsGroup):
    """The OpenAI-compatible API (app/web/api)."""

    api_max_tokens: int = Field(default=4096, ge=1, description="largest max_tokens a caller may ask")
    api_max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    api_max_concurrent_per_key: int = Field(
        default=4, ge=0, le=10000,
        description="requests (streams included) one API key may have in flight at once, over "
                    "every web process; past it 429 with Retry-After (app/web/api/concurrency.py); 0 = no limit")
    api_reasoning: Literal["separate", "strip"] = Field(
        default="separate", description="a reasoning model's think part: reasoning_content, or dropped")


class AdminSettings(SettingsGroup):
    """The admin site (app/web/admin): sessions, sign-in limits, the finance export's wording."""

    session_cookie_secure: bool = Field(default=True, description="false only for plain-http dev/tests")
    admin_session_hours: int = 8
    admin_lockout_attempts: int = 5
    admin_lockout_minutes: int = 15
    admin_login_ip_limit: str = Field(default="10/min", description="login attempts per client address")
    admin_login_global_limit: str = Field(default="100/min", description="login attempts, everyone together")
    admin_login_concurrency: int = Field(default=2, ge=1, le=16,
                                         description="argon2 checks at once per process (64 MiB each)")
    finance_accounting_subject: str = "研发费用-外部技术服务费"
    finance_invoice_item: str = "AI模型调用服务费"

    @field_validator("admin_login_ip_limit", "admin_login_global_limit")
    @classmethod
    def _admin_rate_parses(cls, value: str) -> str:
        parse_rate(value)
        return value
