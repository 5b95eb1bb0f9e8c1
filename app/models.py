"""Database models.

``InboundMessage`` is the outbox of the message path: the callback writes one row per accepted
WeCom message (status ``queued``) and the worker moves it to ``answered``, ``failed`` or
``ignored``. Content, user id and reply are AES-GCM fields (see ``app.security``); only their
blind indexes are stored in clear.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, UTCDateTime, utcnow

BigInt = BigInteger().with_variant(Integer, "sqlite")


class MessageStatus:
    QUEUED = "queued"
    PROCESSING = "processing"
    ANSWERED = "answered"
    FAILED = "failed"
    IGNORED = "ignored"

    PENDING = (QUEUED, PROCESSING)
    FINAL = (ANSWERED, FAILED, IGNORED)


class InboundMessage(Base):
    __tablename__ = "inbound_messages"

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    dedup_hash: Mapped[str] = mapped_column(String(64), unique=True)
    channel: Mapped[str] = mapped_column(String(16), default="app")
    agent_id: Mapped[int | None] = mapped_column(Integer)
    user_hash: Mapped[str] = mapped_column(String(64))
    user_enc: Mapped[str | None] = mapped_column(Text)
    msg_type: Mapped[str] = mapped_column(String(32))
    event: Mapped[str | None] = mapped_column(String(32))
    payload_enc: Mapped[str | None] = mapped_column(Text)
    wecom_create_time: Mapped[int] = mapped_column(BigInteger)
    request_id: Mapped[str | None] = mapped_column(String(32))

    status: Mapped[str] = mapped_column(String(16), default=MessageStatus.QUEUED)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    reply_enc: Mapped[str | None] = mapped_column(Text)
    reply_kind: Mapped[str | None] = mapped_column(String(16))
    chunks_total: Mapped[int | None] = mapped_column(Integer)
    chunks_sent: Mapped[int] = mapped_column(Integer, default=0)
    failure_reason: Mapped[str | None] = mapped_column(String(120))
    model: Mapped[str | None] = mapped_column(String(64))
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)

    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    enqueued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    answered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        Index("ix_inbound_user_order", "user_hash", "id"),
        Index("ix_inbound_status_enqueued", "status", "enqueued_at"),
    )
