"""Accounting and budgets (app/accounting): the company's time zone and currency, budget
thresholds and reservations, and where budget alerts go."""

from __future__ import annotations

from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import field_validator

from app.config.base import SettingsGroup
from app.config.secret_fields import URL
from app.config.values import parse_thresholds


class AccountingSettings(SettingsGroup):
    company_timezone: str = "Asia/Shanghai"
    currency: str = "CNY"
    budget_thresholds: str = "50,80,100"
    budget_reservation_ttl_s: int = 3600
    alert_wecom_users: str = ""
    alert_webhook_url: Annotated[str | None, URL] = None
    alert_webhook_timeout_s: float = 3.0
    # A department budget's alerts also go to the department's heads (WeCom department/get's
    # department_leader): an app message, and the AI bot writing first where its long
    # connection is set up (app/accounting/heads.py).
    alert_department_heads: bool = True

    @field_validator("company_timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {value!r}") from exc
        return value

    @field_validator("budget_thresholds")
    @classmethod
    def _thresholds_parse(cls, value: str) -> str:
        parse_thresholds(value)
        return value

    @field_validator("alert_webhook_url")
    @classmethod
    def _webhook_is_http(cls, value: str | None) -> str | None:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return value or None

    @field_validator("currency")
    @classmethod
    def _currency_code(cls, value: str) -> str:
        if len(value) != 3 or not value.isalpha():
            raise ValueError("must be a 3-letter currency code such as CNY")
        return value.upper()

    @property
    def timezone(self) -> ZoneInfo:
        return ZoneInfo(self.company_timezone)

    @property
    def thresholds(self) -> tuple[int, ...]:
        return parse_thresholds(self.budget_thresholds)

    @property
    def alert_recipients(self) -> list[str]:
        return [u.strip() for u in self.alert_wecom_users.replace("|", ",").split(",") if u.strip()]
