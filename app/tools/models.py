"""The tables of registered tool servers and of who may use their tools.

``tool_servers``: one MCP server an admin registered (streamable HTTP URL or a stdio command);
``secrets_enc`` is its own credentials (HTTP headers, or a stdio process's environment) as a
JSON object sealed like every other secret column. ``tool_policies``: which departments may use
one of its tools and whether the tool acts (asks before running); a tool without a row is never
offered to anyone.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, UTCDateTime, utcnow
from app.models import ENCRYPTED_COLUMNS

EVERYONE = "*"


class ToolServer(Base):
    __tablename__ = "tool_servers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    transport: Mapped[str] = mapped_column(String(8))  # http | stdio
    target: Mapped[str] = mapped_column(Text)  # the URL, or the command line (no secret in it)
    secrets_enc: Mapped[str | None] = mapped_column(Text)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class ToolPolicy(Base):
    __tablename__ = "tool_policies"

    server_id: Mapped[int] = mapped_column(Integer, ForeignKey("tool_servers.id", ondelete="CASCADE"),
                                           primary_key=True)
    tool: Mapped[str] = mapped_column(String(128), primary_key=True)
    departments: Mapped[str] = mapped_column(String(1024))  # "1,2,7" or "*"
    side_effect: Mapped[bool | None] = mapped_column(Boolean)  # None: from the tool's readOnlyHint
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


ENCRYPTED_COLUMNS[ToolServer.__tablename__] = ("id", ("secrets_enc",))
