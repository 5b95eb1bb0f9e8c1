"""Database models.

``InboundMessage`` is the outbox of the message path: the callback writes one row per accepted
WeCom message (status ``queued``) and the worker moves it to ``answered``, ``failed`` or
``ignored``. Content, user id and reply are AES-GCM fields (see ``app.security``); only their
blind indexes are stored in clear.

The data layer (``app.audit.chain``, ``app.accounting``) adds the hash-chained audit log and the
usage, price, budget and alert tables. No table holds message text, reply text or a WeCom user id
in clear: users appear as their blind index (``user_hash``), everything else sensitive is sealed.
``ENCRYPTED_COLUMNS`` lists every sealed column, for ``keys rotate``.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from sqlalchemy import (
    BigInteger,
    Boolean,
    Date,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, Money, UTCDateTime, utcnow

BigInt = BigInteger().with_variant(Integer, "sqlite")


class MessageStatus:
    QUEUED = "queued"
    PROCESSING = "processing"
    ANSWERED = "answered"
    FAILED = "failed"
    IGNORED = "ignored"
    RATE_LIMITED = "rate_limited"  # over the per-user limit: a notice (once a window), no model

    PENDING = (QUEUED, PROCESSING)
    FINAL = (ANSWERED, FAILED, IGNORED, RATE_LIMITED)


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
    # The AI bot channel's stream id (WeCom polls it until the answer is finished); None for the app.
    stream_id: Mapped[str | None] = mapped_column(String(32))

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
        UniqueConstraint("stream_id", name="uq_inbound_stream_id"),
    )


# -- audit log (app.audit.chain) -------------------------------------------------------------------------
class AuditEvent(Base):
    """One append-only event. ``row_hash`` seals every other column, ``prev_hash`` included."""

    __tablename__ = "audit_events"

    seq: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    event_type: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(80))
    outcome: Mapped[str] = mapped_column(String(16))
    request_id: Mapped[str | None] = mapped_column(String(32))
    fingerprint: Mapped[str | None] = mapped_column(String(64))
    payload_enc: Mapped[str] = mapped_column(Text)
    prev_hash: Mapped[str] = mapped_column(String(64))
    row_hash: Mapped[str] = mapped_column(String(64), unique=True)

    __table_args__ = (
        Index("ix_audit_created", "created_at"),
        Index("ix_audit_type_created", "event_type", "created_at"),
        Index("ix_audit_actor_created", "actor", "created_at"),
    )


class AuditChain(Base):
    """The chain's single head row: the lock appenders take, the last link, the purge anchor."""

    __tablename__ = "audit_chain"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    last_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    last_hash: Mapped[str] = mapped_column(String(64))
    anchor_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    anchor_hash: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)  # when sealed
    # app.audit.head: the id of the chain key that sealed the head, and the head's MAC over all
    # of the above (None only before the first append since migration 0007).
    key_id: Mapped[str | None] = mapped_column(String(16))
    head_mac: Mapped[str | None] = mapped_column(String(64))


# -- accounting (app.accounting) -------------------------------------------------------------------
class ModelPrice(Base):
    """Prices per million tokens; a new row (later ``valid_from``) is a new version."""

    __tablename__ = "model_prices"

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(64))  # "*" is the fallback for unlisted models
    input_per_m: Mapped[Decimal] = mapped_column(Money)
    cached_input_per_m: Mapped[Decimal] = mapped_column(Money)
    output_per_m: Mapped[Decimal] = mapped_column(Money)
    currency: Mapped[str] = mapped_column(String(3), default="CNY")
    valid_from: Mapped[datetime] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (UniqueConstraint("model", "valid_from", name="uq_price_model_from"),)


class UsageRecord(Base):
    """One model call."""

    __tablename__ = "usage_records"

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    day: Mapped[date] = mapped_column(Date)  # the company-local day, as the rollups use it
    user_hash: Mapped[str] = mapped_column(String(64))
    department: Mapped[str] = mapped_column(String(32), default="")
    api_key_id: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(64))
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    cost: Mapped[Decimal] = mapped_column(Money)
    currency: Mapped[str] = mapped_column(String(3), default="CNY")
    price_id: Mapped[int | None] = mapped_column(BigInt)
    latency_ms: Mapped[int] = mapped_column(Integer, default=0)
    message_id: Mapped[int | None] = mapped_column(BigInt)

    __table_args__ = (
        Index("ix_usage_created", "created_at"),
        Index("ix_usage_user_day", "user_hash", "day"),
        Index("ix_usage_dept_day", "department", "day"),
    )


class UsageDaily(Base):
    """Rollup per company-local day x department x user x model, upserted with every call."""

    __tablename__ = "usage_daily"

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    department: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(64), primary_key=True)
    calls: Mapped[int] = mapped_column(BigInteger, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cost: Mapped[Decimal] = mapped_column(Money, default=Decimal(0))

    __table_args__ = (
        Index("ix_daily_dept_day", "department", "day"),
        Index("ix_daily_user_day", "user_hash", "day"),
        Index("ix_daily_model_day", "model", "day"),
    )


class BudgetScope:
    GLOBAL = "global"
    DEPARTMENT = "department"
    USER = "user"
    API_KEY = "api_key"
    ALL = (GLOBAL, DEPARTMENT, USER, API_KEY)


class Budget(Base):
    __tablename__ = "budgets"

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    scope: Mapped[str] = mapped_column(String(16))
    scope_value: Mapped[str] = mapped_column(String(64), default="")  # dept id, user hash, key id
    period: Mapped[str] = mapped_column(String(8))  # day | week | month
    limit: Mapped[Decimal] = mapped_column("limit_amount", Money)
    currency: Mapped[str] = mapped_column(String(3), default="CNY")
    thresholds: Mapped[str] = mapped_column(String(64), default="50,80,100")
    action: Mapped[str] = mapped_column(String(8), default="block")  # block | warn
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (UniqueConstraint("scope", "scope_value", "period", name="uq_budget_scope"),)


class BudgetPeriod(Base):
    """A budget's running totals for one period: the row enforcement locks."""

    __tablename__ = "budget_periods"

    budget_id: Mapped[int] = mapped_column(ForeignKey("budgets.id", ondelete="CASCADE"),
                                           primary_key=True)
    period_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    spent: Mapped[Decimal] = mapped_column(Money, default=Decimal(0))
    reserved: Mapped[Decimal] = mapped_column(Money, default=Decimal(0))


class BudgetReservation(Base):
    """The worst case held for one model call until it is settled or released."""

    __tablename__ = "budget_reservations"

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    amount: Mapped[Decimal] = mapped_column(Money)
    periods: Mapped[str] = mapped_column(Text)  # "budget_id@period_start_iso,..."
    message_id: Mapped[int | None] = mapped_column(BigInt)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (Index("ix_reservation_created", "created_at"),)


class BudgetAlert(Base):
    """A threshold crossed; the unique key makes each alert happen once per budget and period."""

    __tablename__ = "budget_alerts"

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    budget_id: Mapped[int] = mapped_column(ForeignKey("budgets.id", ondelete="CASCADE"))
    period_start: Mapped[datetime] = mapped_column(UTCDateTime)
    threshold: Mapped[int] = mapped_column(Integer)
    spent: Mapped[Decimal] = mapped_column(Money)
    limit: Mapped[Decimal] = mapped_column("limit_amount", Money)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    delivered: Mapped[str | None] = mapped_column(String(64))  # "wecom,webhook" once sent

    __table_args__ = (
        UniqueConstraint("budget_id", "period_start", "threshold", name="uq_alert_once"),
        Index("ix_alert_created", "created_at"),
    )


# -- API keys (app.web.api) ----------------------------------------------------------------------------
class ApiKey(Base):
    """A key of one internal application for ``/v1``: only its HMAC is stored, never the key.

    ``name`` is the key's identity everywhere else: the usage rows' ``api_key_id``, the scope
    value of an ``api_key`` budget, the audit actor (``api_key:<name>``).
    """

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))  # the key's first characters, for display
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The key's SHA-256, sealed (DATA_KEYS): what ``keys rotate-index`` re-computes ``key_hash``
    # from under a new BLIND_INDEX_KEY. None for a key made before migration 0009 until its
    # next use (app/web/api/keys.py). A hash, not the key: the database and DATA_KEYS together still
    # cannot call the API.
    key_seal: Mapped[str | None] = mapped_column(Text)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    rate_limit_per_min: Mapped[int] = mapped_column(Integer, default=60)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


# Every AES-GCM column: (table, primary key column, sealed columns). ``keys rotate`` walks these.
ENCRYPTED_COLUMNS: dict[str, tuple[str, tuple[str, ...]]] = {
    InboundMessage.__tablename__: ("id", ("user_enc", "payload_enc", "reply_enc")),
    AuditEvent.__tablename__: ("seq", ("payload_enc",)),
    ApiKey.__tablename__: ("id", ("key_seal",)),
}


# -- admin accounts (app.web.admin) --------------------------------------------------------------------
class AdminRole:
    ADMIN = "admin"  # budgets, prices, users
    FINANCE = "finance"  # cost views, cost export
    AUDITOR = "auditor"  # audit search and export
    ALL = (ADMIN, FINANCE, AUDITOR)


class AdminUser(Base):
    """A local admin account: argon2 password hash, one role, lockout after failed logins."""

    __tablename__ = "admin_users"

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16))
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    failed_attempts: Mapped[int] = mapped_column(Integer, default=0)
    locked_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_login_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    # Flask-Login's protocol
    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def is_active(self) -> bool:
        return self.enabled

    @property
    def is_anonymous(self) -> bool:
        return False

    def get_id(self) -> str:
        return str(self.id)


class AdminSession(Base):
    """A signed-in admin session, server-side: the cookie carries a random token, this row its
    SHA-256. Logout deletes the row (a copied cookie opens nothing afterwards); ``expires_at`` is
    fixed at login (``ADMIN_SESSION_HOURS``), however busy the session is."""

    __tablename__ = "admin_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 hex of the token
    user_id: Mapped[int] = mapped_column(BigInt, ForeignKey("admin_users.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (Index("ix_admin_sessions_user", "user_id"),
                      Index("ix_admin_sessions_expires", "expires_at"))


class WeComRoleMapping(Base):
    """Who may sign in to the admin site with WeCom, and as what (app.sso.roles): a WeCom userid
    (``kind`` user) or a department id (``kind`` department) and the role it grants. A userid's
    own row wins over its departments'."""

    __tablename__ = "wecom_role_mappings"

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))  # user | department
    value: Mapped[str] = mapped_column(String(64))  # the userid (lower case) or the department id
    role: Mapped[str] = mapped_column(String(16))
    created_by: Mapped[str] = mapped_column(String(80))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (UniqueConstraint("kind", "value", name="uq_wecom_role_mappings_kind_value"),)


# -- knowledge base (app.knowledge) ----------------------------------------------------------------
class KnowledgeVisibility:
    ALL = "all"  # every employee
    DEPARTMENTS = "departments"  # only members of the departments in kb_document_departments


class KnowledgeDocument(Base):
    """An uploaded document: title, file name and text sealed; ``title_hash`` (blind index of the
    normalized title) finds the document a re-upload replaces; ``content_hash`` (keyed) tells an
    unchanged re-upload apart. ``chunk_count``/``term_total`` feed BM25's collection statistics
    without reading the chunks. ``contacts_enc``: who owns each section, sealed JSON
    (app.knowledge.contacts)."""

    __tablename__ = "kb_documents"

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    title_hash: Mapped[str] = mapped_column(String(64), unique=True)
    title_enc: Mapped[str] = mapped_column(Text)
    filename_enc: Mapped[str | None] = mapped_column(Text)
    content_enc: Mapped[str] = mapped_column(Text)
    contacts_enc: Mapped[str | None] = mapped_column(Text)
    content_hash: Mapped[str] = mapped_column(String(64))
    doc_type: Mapped[str] = mapped_column(String(16))
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    visibility: Mapped[str] = mapped_column(String(16), default=KnowledgeVisibility.ALL)
    chunk_count: Mapped[int] = mapped_column(Integer, default=0)
    term_total: Mapped[int] = mapped_column(BigInteger, default=0)
    version: Mapped[int] = mapped_column(Integer, default=1)
    updated_by: Mapped[str] = mapped_column(String(80), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (Index("ix_kb_documents_visibility", "visibility"),)


class KnowledgeDocumentDepartment(Base):
    """One department allowed to see a ``departments``-visibility document (WeCom department id)."""

    __tablename__ = "kb_document_departments"

    document_id: Mapped[int] = mapped_column(
        BigInt, ForeignKey("kb_documents.id", ondelete="CASCADE"), primary_key=True)
    department_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)

    __table_args__ = (Index("ix_kb_docdept_department", "department_id"),)


class KnowledgeChunk(Base):
    """A passage. ``id`` is ``document_id * CHUNK_ID_SPAN + ordinal`` (app.knowledge.store), known
    before the insert, so the sealed columns' associated data can name the row (``keys rotate``
    re-seals by it) without a round trip per chunk. ``length``: its terms, BM25's document length."""

    __tablename__ = "kb_chunks"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    document_id: Mapped[int] = mapped_column(BigInt, ForeignKey("kb_documents.id", ondelete="CASCADE"))
    ordinal: Mapped[int] = mapped_column(Integer)
    section_enc: Mapped[str] = mapped_column(Text)
    text_enc: Mapped[str] = mapped_column(Text)
    tokens: Mapped[int] = mapped_column(Integer)
    length: Mapped[int] = mapped_column(Integer)
    # the chunk's embedding (float32, unit length), sealed; None without an embeddings server
    vector_enc: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (Index("ix_kb_chunks_document", "document_id"),)


class KnowledgePosting(Base):
    """The inverted index: a keyed hash of a term (never the term) -> the chunks holding it, with
    the term's frequency there and the chunk's length (so scoring never reads kb_chunks). Keyed by
    (term, chunk_id) and, on SQLite, stored WITHOUT ROWID: a term's postings lie together."""

    __tablename__ = "kb_postings"

    term: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    chunk_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    document_id: Mapped[int] = mapped_column(BigInt, ForeignKey("kb_documents.id", ondelete="CASCADE"))
    tf: Mapped[int] = mapped_column(Integer)
    dl: Mapped[int] = mapped_column(Integer)

    __table_args__ = (Index("ix_kb_postings_document", "document_id"),
                      {"sqlite_with_rowid": False})


ENCRYPTED_COLUMNS.update({
    KnowledgeDocument.__tablename__: ("id", ("title_enc", "filename_enc", "content_enc")),
    KnowledgeChunk.__tablename__: ("id", ("section_enc", "text_enc", "vector_enc")),
})


# -- feedback on answers (app.feedback.ratings) ------------------------------------------------------------
class AnswerRating(Base):
    """One 👍/👎 on a model answer: at most one per message (``message_id`` is unique, so WeCom's
    retries and a second click store nothing). ``model`` and ``department`` are copied from the
    answer's usage row, so the dashboard groups ratings without joining the usage tables.

    The AI bot's ratings (channel ``aibot``, revision 0011) may change: a later 👍/👎 replaces the
    rating, a withdrawal sets it to 0 (counted neither way); ``reasons`` holds WeCom's
    ``inaccurate_reason_list`` codes of a 👎 (``"1,3"``; the free text is a sealed
    ``FeedbackComment``)."""

    __tablename__ = "answer_ratings"

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    message_id: Mapped[int] = mapped_column(BigInt)
    rating: Mapped[int] = mapped_column(Integer)  # +1 helpful, -1 not helpful, 0 withdrawn (AI bot)
    channel: Mapped[str] = mapped_column(String(16), default="app")
    user_hash: Mapped[str] = mapped_column(String(64))
    department: Mapped[str] = mapped_column(String(32), default="")
    model: Mapped[str] = mapped_column(String(64), default="")
    day: Mapped[date] = mapped_column(Date)  # the company-local day, as the usage rollups
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    reasons: Mapped[str] = mapped_column(String(32), default="", server_default="")

    __table_args__ = (UniqueConstraint("message_id", name="uq_answer_ratings_message"),
                      Index("ix_ratings_day", "day"))


class AnswerSource(Base):
    """One passage a model answer cited (revision 0013): its number in the answer, the document
    and chunk, ``section_key`` (a blind index of the document and section, so the 👎 report
    groups without decrypting) and "title › section" sealed with the row's id. Written when the
    answer is stored, before it is sent (``app.feedback.sources``); a file the employee sent is
    never recorded here."""

    __tablename__ = "answer_sources"

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    message_id: Mapped[int] = mapped_column(BigInt)
    position: Mapped[int] = mapped_column(Integer)
    document_id: Mapped[int] = mapped_column(BigInt)
    chunk_id: Mapped[int] = mapped_column(BigInt)
    section_key: Mapped[str] = mapped_column(String(64))
    source_enc: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (UniqueConstraint("message_id", "position", name="uq_answer_sources_message_position"),
                      Index("ix_answer_sources_section", "document_id", "section_key"))


class FeedbackComment(Base):
    """A ``/feedback <text>`` comment, sealed; ``message_id``: the user's last answer, if any."""

    __tablename__ = "feedback_comments"

    id: Mapped[int] = mapped_column(BigInt, primary_key=True, autoincrement=True)
    message_id: Mapped[int | None] = mapped_column(BigInt)
    user_hash: Mapped[str] = mapped_column(String(64))
    department: Mapped[str] = mapped_column(String(32), default="")
    day: Mapped[date] = mapped_column(Date)
    comment_enc: Mapped[str | None] = mapped_column(Text)  # sealed with the row's id
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (Index("ix_feedback_comments_day", "day"),)


ENCRYPTED_COLUMNS[FeedbackComment.__tablename__] = ("id", ("comment_enc",))


# -- the SIEM export (app.siem) --------------------------------------------------------------------
class SiemCursor(Base):
    """How far one sink has taken one stream: the last audit seq (or usage row id) its receiver
    acknowledged. Moved only forward, by a compare-and-set, after the receiver took the batch."""

    __tablename__ = "siem_cursors"

    sink: Mapped[str] = mapped_column(String(16), primary_key=True)  # syslog | otlp
    stream: Mapped[str] = mapped_column(String(16), primary_key=True)  # audit | usage
    position: Mapped[int] = mapped_column(BigInteger, default=0)
    exported: Mapped[int] = mapped_column(BigInteger, default=0)  # events sent, all runs
    clear_fields: Mapped[str | None] = mapped_column(String(512))  # the policy last exported under
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_error: Mapped[str | None] = mapped_column(String(200))  # why the last run stopped; None: ok


class KfCursor(Base):
    """How far the bot has read one 微信客服 account's messages (kf/sync_msg's next_cursor).
    Moved by a compare-and-set in the transaction that writes the page's messages to the
    outbox (``app.kf.sync``): a page is taken whole, once, whoever reads it."""

    __tablename__ = "kf_cursors"

    open_kfid: Mapped[str] = mapped_column(String(64), primary_key=True)  # the company's account
    cursor: Mapped[str] = mapped_column(String(128), default="")
    synced: Mapped[int] = mapped_column(BigInteger, default=0)  # customer messages taken, all runs
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
