"""WeCom sign-in for the admin site (app/sso, docs/wecom-signin.md): WeCom's two login hosts,
the callback address WeCom sends the browser back to, how long a started sign-in may take, and
whether the local password login (the break-glass way in) stays open."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from app.config.base import SettingsGroup
from app.config.secret_fields import URL


class WeComLoginSettings(SettingsGroup):
    """企业微信扫码登录 (QR, in a desktop browser) and OAuth (inside the WeCom client)."""

    wecom_login_enabled: bool = Field(default=False, description="offer 'Sign in with WeCom'")
    wecom_login_base: Annotated[str, URL] = Field(
        default="https://login.work.weixin.qq.com",
        description="host of the QR login page /wwlogin/sso/login (the emulator's in dev)")
    wecom_oauth_base: Annotated[str, URL] = Field(
        default="https://open.weixin.qq.com",
        description="host of /connect/oauth2/authorize, used inside the WeCom client")
    wecom_login_redirect_url: Annotated[str, URL] = Field(
        default="",
        description="the public https address of /admin/login/wecom/callback (its host must be "
                    "the app's trusted domain); empty: built from the request")
    wecom_login_state_ttl_s: int = Field(default=300, ge=30, le=1800,
                                         description="how long a started sign-in stays valid")
    # The local accounts' password form (no "password" in the name: it holds none).
    admin_local_login: bool = Field(default=True,
                                    description="false closes the password login (break-glass)")

    @field_validator("wecom_login_base", "wecom_oauth_base", "wecom_login_redirect_url")
    @classmethod
    def _wecom_login_http_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if value and (urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).hostname):
            raise ValueError("must be an http(s) URL")
        return value

    @model_validator(mode="after")
    def _someone_can_sign_in(self):
        if not self.admin_local_login and not self.wecom_login_enabled:
            raise ValueError("ADMIN_LOCAL_LOGIN=false needs WECOM_LOGIN_ENABLED=true: "
                             "otherwise nobody can sign in to the admin site")
        return self
