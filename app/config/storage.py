"""Where state lives: the database (and its read replica), Redis and the task broker."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator, model_validator

from app.config.base import SettingsGroup
from app.config.secret_fields import URL


class DatabaseSettings(SettingsGroup):
    database_url: Annotated[str, URL] = "sqlite:///var/wecom-bot.sqlite3"
    database_replica_url: Annotated[str, URL] = Field(
        default="",
        description="a PostgreSQL streaming replica for the dashboard, reports and exports "
                    "(empty: they read the primary); writes always go to DATABASE_URL")

    @field_validator("database_replica_url")
    @classmethod
    def _replica_matches_primary(cls, value: str, info: ValidationInfo) -> str:
        value = value.strip()
        if value and "database_url" in info.data:  # a bad DATABASE_URL is reported on its own
            from app.db import check_replica_url

            check_replica_url(info.data["database_url"], value)
        return value


class QueueSettings(SettingsGroup):
    """Redis (caches, locks, streams) and Celery's broker (``REDIS_URL`` unless set)."""

    redis_url: Annotated[str, URL] = "redis://127.0.0.1:6379/0"
    celery_broker_url: Annotated[str | None, URL] = None

    @model_validator(mode="after")
    def _broker_defaults_to_redis(self):
        if not self.celery_broker_url:
            self.celery_broker_url = self.redis_url
        return self
