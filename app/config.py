"""Settings, read once from the environment (or `.env`, or files in ``SECRETS_DIR``).

A missing or malformed secret must stop start-up with a message that names the variable, so
``load_settings`` turns pydantic's validation errors into one ``ConfigError`` listing them.
"""

from __future__ import annotations

import base64
import binascii
import os
import string
import zlib
from functools import lru_cache
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConfigError(RuntimeError):
    """The environment does not describe a runnable service."""


# Words of the placeholders examples and tutorials ship ("replace-with-...", "change-me", ...).
# .env.example's old SECRET_KEY placeholder passed the length check, and anyone who read the
# repository could then sign an admin session cookie.
PLACEHOLDER_WORDS = ("replace", "changeme", "change-me", "change_me", "example", "placeholder",
                     "your-", "your_", "xxxxxx", "0123456789abcdef", "abcdefghijklmnop")
MIN_SECRET_BYTES = 32
GENERATE_HINT = "python -c 'import secrets; print(secrets.token_urlsafe(48))'"


def refuse_placeholder(value: str) -> None:
    lowered = value.lower()
    if any(word in lowered for word in PLACEHOLDER_WORDS):
        raise ValueError("is a placeholder, not a secret")


def refuse_low_entropy(key: bytes) -> None:
    """Random bytes, not a pattern: 32 random bytes have ~30 distinct values (fewer than 16 has
    odds below 1e-15) and never shrink under zlib; a repeated or constant key does both."""
    if len(set(key)) < 16 or len(zlib.compress(key, 9)) < len(key):
        raise ValueError("is not random (a repeating or constant pattern)")


def decode_random_secret(value: str) -> bytes:
    """The bytes of a generated secret: hex, or base64 (standard or URL-safe, padded or not),
    at least ``MIN_SECRET_BYTES`` of them, random-looking; ValueError naming what is wrong."""
    refuse_placeholder(value)
    text = value.strip()
    try:
        if len(text) % 2 == 0 and all(c in string.hexdigits for c in text):
            raw = bytes.fromhex(text)
        else:
            raw = base64.b64decode(text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4),
                                   validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"must be random bytes in hex or base64, e.g. {GENERATE_HINT}") from None
    if len(raw) < MIN_SECRET_BYTES:
        raise ValueError(f"must be at least {MIN_SECRET_BYTES} random bytes (hex or base64), "
                         f"e.g. {GENERATE_HINT}")
    refuse_low_entropy(raw)
    return raw


def _decode_data_key(kid: str, value: str) -> bytes:
    try:
        key = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"key {kid!r} is not base64") from exc
    if len(key) != 32:
        raise ValueError(f"key {kid!r} must be 32 bytes (AES-256), got {len(key)}")
    try:
        refuse_low_entropy(key)
    except ValueError as exc:
        raise ValueError(f"key {kid!r} {exc}") from None
    return key


def split_blind_index_keys(spec: str) -> list[str]:
    """``"NEW,OLD"`` -> [NEW, OLD]: BLIND_INDEX_KEY's keyring, current first, each a random secret
    (placeholders and low-entropy values refused for every one, as for a single key)."""
    keys = [k.strip() for k in spec.replace("\n", ",").split(",") if k.strip()]
    if not keys:
        raise ValueError("must not be empty")
    for number, key in enumerate(keys, 1):
        try:
            decode_random_secret(key)
        except ValueError as exc:
            raise ValueError(f"key {number} {exc}" if len(keys) > 1 else str(exc)) from None
    if len(set(keys)) != len(keys):
        raise ValueError("a key appears twice")
    return keys


def parse_keyring(spec: str) -> dict[str, bytes]:
    """``"k2:BASE64,k1:BASE64"`` -> ordered {key id: 32-byte key}; the first one is primary."""
    keys: dict[str, bytes] = {}
    for item in filter(None, (part.strip() for part in spec.replace("\n", ",").split(","))):
        kid, sep, value = item.partition(":")
        if not sep or not kid.isalnum() or len(kid) > 16:
            raise ValueError("entries must look like 'keyid:base64key' (key id alphanumeric, <= 16)")
        if kid in keys:
            raise ValueError(f"key id {kid!r} appears twice")
        keys[kid] = _decode_data_key(kid, value.strip())
    if not keys:
        raise ValueError("at least one key is required")
    return keys


def parse_thresholds(spec: str) -> tuple[int, ...]:
    """``"50,80,100"`` -> (50, 80, 100): percentages of a budget, each alerted once a period."""
    try:
        values = sorted({int(part) for part in spec.split(",") if part.strip()})
    except ValueError:
        raise ValueError("thresholds must be whole percentages like '50,80,100'") from None
    if not values or values[0] < 1 or values[-1] > 1000:
        raise ValueError("thresholds must be percentages between 1 and 1000")
    return tuple(values)


RATE_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600,
              "hour": 3600}


def parse_rate(spec: str) -> tuple[int, int]:
    """``"20/min"`` -> (20, 60): at most 20 per 60 s; ``"0"`` turns the limit off (0, 60)."""
    count, _, unit = spec.strip().lower().partition("/")
    try:
        limit = int(count)
    except ValueError:
        raise ValueError("must look like '20/min' (a whole number per s, min or hour)") from None
    window = RATE_UNITS.get(unit.strip() or "min")
    if window is None or limit < 0:
        raise ValueError("must look like '20/min' (a whole number per s, min or hour)")
    return limit, window


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_file=".env", env_file_encoding="utf-8", extra="ignore",
        secrets_dir=os.environ.get("SECRETS_DIR") or None,
    )

    # -- WeCom ---------------------------------------------------------------------------------
    wecom_corp_id: str = Field(min_length=1)
    wecom_agent_id: int
    wecom_secret: SecretStr
    wecom_token: SecretStr
    wecom_aes_key: SecretStr
    wecom_api_base: str = "https://qyapi.weixin.qq.com"

    # -- AI bot (智能机器人) channel, /wecom/aibot: off unless token and key are both set ------
    aibot_token: SecretStr | None = None
    aibot_encoding_aes_key: SecretStr | None = None
    aibot_name: str = Field(default="", description="the bot's name, to see @mentions in groups")
    aibot_stream_deadline_s: float = Field(default=330.0, ge=10, le=345,
                                           description="finish a stream before WeCom's 6 minutes")
    aibot_stream_ttl_s: int = Field(default=900, ge=360)
    aibot_refresh_throttle_s: float = Field(default=0.2, ge=0, le=5)
    aibot_thinking_text: str = ""
    # -- the AI bot's long connection (python -m app.aibot_connection, docs/aibot.md): the bot
    # dials out over a WebSocket, no public URL; off unless the bot id and secret are both set.
    aibot_bot_id: str = ""
    aibot_secret: SecretStr | None = None
    aibot_ws_url: str = Field(default="wss://openws.work.weixin.qq.com",
                              description="WeCom's long-connection endpoint (the emulator's in dev)")
    aibot_ws_heartbeat_s: float = Field(default=30.0, gt=0, le=120)
    aibot_ws_lease_s: float = Field(default=5.0, ge=1, le=60,
                                    description="the Redis lease a connection holder renews")
    aibot_ws_backoff_max_s: float = Field(default=30.0, ge=1, le=600)

    # -- storage and queue ---------------------------------------------------------------------
    database_url: str = "sqlite:///var/wecom-bot.sqlite3"
    database_replica_url: str = Field(
        default="",
        description="a PostgreSQL streaming replica for the dashboard, reports and exports "
                    "(empty: they read the primary); writes always go to DATABASE_URL")
    redis_url: str = "redis://127.0.0.1:6379/0"
    celery_broker_url: str | None = None

    # -- data protection (see app/security) ----------------------------------------------------
    data_keys: SecretStr = Field(description="keyring: 'kid:base64(32 bytes),...', primary first")
    blind_index_key: SecretStr = Field(
        description="HMAC keys of the blind indexes and API-key digests: 'NEW,OLD', current first "
                    "(lookups try each; 'keys rotate-index' moves every index to the first)")
    _blind_index_older: list[str] = PrivateAttr(default_factory=list)
    secret_key: SecretStr = Field(description="server secret: Flask sessions, fingerprints")
    secret_key_previous: SecretStr = Field(
        default=SecretStr(""),
        description="earlier SECRET_KEYs, comma-separated, newest first: audit rows and exports "
                    "sealed before a rotation still verify ('keys rotate' re-seals the chain)")

    # -- behind a reverse proxy (app/proxy.py) ------------------------------------------------
    trusted_proxies: int = Field(default=0, ge=0, le=10,
                                 description="proxies in front whose X-Forwarded-* are believed; 0 = none")

    # -- callback ------------------------------------------------------------------------------
    callback_max_bytes: int = 64 * 1024
    request_body_timeout_s: float = Field(
        default=10.0, gt=0, le=300,
        description="a request body (callback, /v1) must arrive whole within this: else 408 "
                    "(app/body_reader.py), so a client trickling one cannot hold a thread")
    callback_timestamp_window_s: int = 300
    # The intake server (app/intake/server.py) that gunicorn.conf.py runs writes every web
    # process's callbacks; its socket is set there. Unset: each web process writes its own.
    intake_socket: str | None = None
    intake_linger_ms: float = Field(
        default=1.0, ge=0, le=20,
        description="how long a batch of the intake server may wait for callbacks that busy "
                    "connections are about to send (a lone client never waits)")

    # -- worker --------------------------------------------------------------------------------
    conversation_ttl_s: int = 24 * 3600
    conversation_max_messages: int = 20
    claim_lease_s: float = 30.0
    sweep_interval_s: float = 30.0
    sweep_queued_after_s: float = 60.0
    task_max_retries: int = 5
    worker_heartbeat_ttl_s: float = Field(default=30.0, ge=3, description="see worker/observability/heartbeat.py")
    # WeCom's duplicate check on every reply chunk: a retried send whose first answer was lost
    # (a timeout) is not delivered twice. The same reply to the same user within this window is
    # dropped by WeCom too, so it only needs to span the retries (1..14400 s).
    wecom_duplicate_check_s: int = Field(default=900, ge=1, le=14400)
    # 45009 (WeCom's frequency limit, counted per minute and per hour): the first retry waits
    # this long, each further one twice as long, at most 300 s (worker/retry_policy.py).
    wecom_rate_limit_retry_s: float = Field(default=60.0, ge=1, le=300)
    # A 👍/👎 template card after each model answer on the app channel, and WeCom's own 👍/👎
    # under the AI bot's answers (feedback.id on the first stream reply): app.feedback.
    feedback_cards: bool = True
    # An app answer with Markdown goes as WeCom's markdown message (headings, bold, links, inline
    # code, quotes; lists and tables rewritten as text: app/wecom/markdown.py); false: always a
    # text message with the markup taken out (members who read the app in the WeChat plugin,
    # 微信插件, which shows no markdown message).
    wecom_markdown: bool = True
    welcome_message: str = "你好，我是公司的 AI 助手，有问题随时问我。Hi, I'm the company assistant."

    # -- audit, accounting, budgets (see app/audit.py, app/accounting.py) ----------------------
    audit_retention_days: int = Field(default=180, description="never below 180 (6 months)")
    audit_checkpoint_minutes: int = Field(
        default=60, ge=0, le=1440,
        description="the beat seals a checkpoint event this often; 'audit verify' reports a "
                    "head sealed more than twice this long ago (a cut tail); 0 = neither")
    audit_head_file: str | None = Field(
        default=None, description="a copy of the chain head outside the database, compared by "
                                  "'audit verify' (a path the database's users cannot write)")
    audit_export_key: SecretStr | None = Field(
        default=None, description="Ed25519 key signing exports: PKCS#8 PEM, or base64 of the "
                                  "32-byte seed ('audit public-key' prints the public half)")
    audit_export_key_file: str | None = Field(default=None, description="or a PEM file of it")
    company_timezone: str = "Asia/Shanghai"
    currency: str = "CNY"
    budget_thresholds: str = "50,80,100"
    budget_reservation_ttl_s: int = 3600
    department_cache_s: int = 24 * 3600
    alert_wecom_users: str = ""
    alert_webhook_url: str | None = None
    alert_webhook_timeout_s: float = 3.0

    # -- admin (see app/admin) -----------------------------------------------------------------
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

    # -- observability (docs/observability.md) ------------------------------------------------
    log_format: Literal["json", "text"] = Field(default="json", description="text for development")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    metrics_token: SecretStr = Field(default=SecretStr(""),
                                     description="bearer token for /metrics from non-loopback")
    metrics_port: int = Field(default=0, ge=0, le=65535, description="worker metrics port, 0 = off")
    metrics_addr: str = Field(default="127.0.0.1", description="worker metrics bind address")
    wecom_user_rate_limit: str = Field(default="20/min", description="per WeCom user; 0 = off")

    # -- inference -----------------------------------------------------------------------------
    inference_backend: Literal["engine", "openai"] = "engine"
    model_dir: str = "models/demo"
    engine_max_num_seqs: int = 64
    engine_max_model_len: int | None = None
    engine_kv_cache_bytes: int | None = None
    engine_speculative_k: int = Field(default=0, ge=0, le=8,
                                      description="MTP drafts per step for every chat (0 = plain decoding)")
    openai_base_url: str = "http://127.0.0.1:8000/v1"
    openai_api_key: SecretStr = SecretStr("")
    openai_model: str = "glm-4"
    openai_timeout_s: float = 120.0
    openai_reply_start: Literal["auto", "answer", "thinking"] = Field(
        default="auto", description="where a reply with inline thinking begins (app/llm/__init__.py)")
    max_new_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 0.9
    system_prompt: str = "你是企业微信里的公司助手，回答简洁、准确、礼貌。"

    # -- knowledge base (app/knowledge, README "Knowledge base") --------------------------------
    kb_enabled: bool = Field(default=True, description="answer from the knowledge base when it has documents")
    kb_max_upload_bytes: int = Field(default=20 * 1024 * 1024, ge=1024)
    kb_chunk_tokens: int = Field(default=200, ge=40, le=2000, description="largest chunk, in tokens")
    kb_top_k: int = Field(default=4, ge=1, le=20, description="passages put in the prompt")
    kb_passages_in_prompt: bool = Field(
        default=True, description="give the model the retrieved passages (false: the question alone, for a "
                                  "model not trained to read passages; sources and 'not found' still apply)")
    kb_min_score: float = Field(default=0.15, ge=0, le=1,
                                description="relevance threshold (share of the question's weight a "
                                            "passage matches); below it: 'not found' without the "
                                            "model, above it the model may still say so")
    kb_fallback_contact: str = Field(default="", description="the team named when nothing is found")
    kb_mode: Literal["strict", "open"] = Field(
        default="strict", description="nothing relevant found: 'strict' says so and names the team (the demo "
                                      "model); 'open' lets the model answer as a general assistant, marked "
                                      "as not from company documents (a capable model; app/knowledge/modes.py)")
    kb_answer_by_quoting: bool = Field(
        default=False, description="the model's reply must be one passage quoted whole with its number, or "
                                   "'not found' (an extractive model such as the bundled demo; the model "
                                   "server must support guided_choice)")
    kb_choice_scoring: Literal["tokens", "likelihood"] = Field(
        default="likelihood", description="with KB_ANSWER_BY_QUOTING, how the reply is chosen: 'likelihood' "
                                          "(each passage read whole, the likeliest quoted: the bundled engine "
                                          "and `inference serve`) or 'tokens' (constrained decoding, as vLLM's "
                                          "guided_choice)")
    kb_decline_bias: float = Field(
        default=0.0, ge=-5, le=5, description="with KB_CHOICE_SCORING=likelihood: added to the 'not found' "
                                              "replies' score (mean log-probability per token); higher "
                                              "declines more")
    kb_min_similarity: float = Field(default=0.6, ge=-1, le=1,
                                     description="cosine from which a dense match is relevant")
    embeddings_base_url: str = Field(default="", description="OpenAI-compatible /v1 with /embeddings; "
                                                             "empty: BM25 only")
    embeddings_api_key: SecretStr = SecretStr("")
    embeddings_model: str = ""
    embeddings_timeout_s: float = Field(default=30.0, gt=0)
    rerank_base_url: str = Field(default="", description="a /v1 serving /rerank (Jina / Cohere format, e.g. vLLM "
                                                         "with bge-reranker-v2-m3); empty: no reranking")
    rerank_api_key: SecretStr = SecretStr("")
    rerank_model: str = ""
    rerank_timeout_s: float = Field(default=10.0, gt=0)
    rerank_candidates: int = Field(default=20, ge=1, le=100,
                                   description="the best fused passages the reranker scores")
    kb_server_retry_s: float = Field(default=30.0, ge=0,
                                     description="after the embeddings or reranking server fails, search "
                                                 "without it for this long before trying it again")
    kb_min_relevance: float = Field(default=0.5, ge=-100, le=100,
                                    description="with a reranker: its score from which a passage is relevant "
                                                "(instead of KB_MIN_SCORE / KB_MIN_SIMILARITY)")

    # -- voice, images and files (worker/media/, README "Voice, images and files") -----------
    media_max_bytes: int = Field(default=10 * 1024 * 1024, ge=1024,
                                 description="largest image, voice or file fetched from WeCom")
    media_url_hosts: str = Field(default="ww-aibot-img-1258476243.cos.ap-guangzhou.myqcloud.com",
                                 description="hosts an AI bot's image or file URL may name, comma-"
                                             "separated (*.example.com: its subdomains); a "
                                             "redirect is never followed")
    voice_max_duration_s: float = Field(default=90.0, gt=0, le=3600,
                                        description="longest voice clip transcribed, counted "
                                                    "before decoding (WeCom records at most 60 s)")
    asr_base_url: str = Field(default="", description="OpenAI-compatible /v1 with /audio/transcriptions; "
                                                      "empty: a voice message gets a polite notice")
    asr_model: str = "whisper-1"
    asr_api_key: SecretStr = SecretStr("")
    asr_language: str = Field(default="", description="a language hint for the ASR server (zh, en)")
    asr_timeout_s: float = Field(default=30.0, gt=0)
    vision_model: str = Field(default="", description="a vision model (GLM-4.6V) on the OpenAI-compatible "
                                                      "backend; empty: an image gets a polite notice")
    vision_base_url: str = Field(default="", description="the vision model's /v1 when not OPENAI_BASE_URL")
    vision_api_key: SecretStr = SecretStr("")
    vision_timeout_s: float = Field(default=120.0, gt=0)
    file_context_max_chars: int = Field(default=20000, ge=500,
                                        description="a conversation's file text kept for the prompt")

    # -- OpenAI-compatible API (app/api) -------------------------------------------------------
    api_max_tokens: int = Field(default=4096, ge=1, description="largest max_tokens a caller may ask")
    api_max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    api_reasoning: Literal["separate", "strip"] = Field(
        default="separate", description="a reasoning model's think part: reasoning_content, or dropped")

    @field_validator("wecom_aes_key", "aibot_encoding_aes_key")
    @classmethod
    def _aes_key_is_43_chars(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        raw = value.get_secret_value()
        if len(raw) != 43:
            raise ValueError(f"must be the 43-character EncodingAESKey (got {len(raw)} characters)")
        try:
            key = base64.b64decode(raw + "=", validate=True)
            if len(key) != 32:
                raise ValueError
        except (binascii.Error, ValueError) as exc:
            raise ValueError("is not a valid EncodingAESKey (base64 of 32 bytes)") from exc
        refuse_placeholder(raw)
        refuse_low_entropy(key)
        return value

    @field_validator("aibot_token", "aibot_encoding_aes_key", "aibot_secret", "intake_socket", mode="before")
    @classmethod
    def _blank_is_unset(cls, value):
        return None if value is None or (isinstance(value, str) and not value.strip()) else value

    @field_validator("wecom_token", "wecom_secret", "secret_key", "blind_index_key")
    @classmethod
    def _not_blank(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("wecom_token", "wecom_secret", "aibot_token", "aibot_secret", "metrics_token")
    @classmethod
    def _not_a_placeholder(cls, value: SecretStr | None) -> SecretStr | None:
        # WeCom's console makes these (the Token may be typed in): refused only as placeholders.
        if value is not None:
            refuse_placeholder(value.get_secret_value())
        return value

    @field_validator("secret_key")
    @classmethod
    def _random_bytes(cls, value: SecretStr) -> SecretStr:
        decode_random_secret(value.get_secret_value())
        return value

    @field_validator("blind_index_key")
    @classmethod
    def _blind_index_keys_random(cls, value: SecretStr) -> SecretStr:
        split_blind_index_keys(value.get_secret_value())
        return value

    @model_validator(mode="after")
    def _blind_index_current_key(self) -> Settings:
        # ``blind_index_key`` keeps the current key alone (what every writer and the knowledge
        # base's term hashes use); the older ones are only for lookups until ``rotate-index``.
        keys = split_blind_index_keys(self.blind_index_key.get_secret_value())
        self.blind_index_key = SecretStr(keys[0])
        self._blind_index_older = keys[1:]
        return self

    @field_validator("data_keys")
    @classmethod
    def _keyring_parses(cls, value: SecretStr) -> SecretStr:
        parse_keyring(value.get_secret_value())
        return value

    @field_validator("audit_head_file", "audit_export_key", "audit_export_key_file", mode="before")
    @classmethod
    def _audit_blank_is_unset(cls, value):
        return None if value is None or (isinstance(value, str) and not value.strip()) else value

    @field_validator("audit_export_key")
    @classmethod
    def _export_key_loads(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            from app.audit_signing import private_key_from_text

            private_key_from_text(value.get_secret_value())
        return value

    @field_validator("audit_retention_days")
    @classmethod
    def _retention_at_least_six_months(cls, value: int) -> int:
        if value < 180:
            raise ValueError("must be at least 180 days (the audit log is kept at least 6 months)")
        return value

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

    @field_validator("log_format", mode="before")
    @classmethod
    def _format_lower(cls, value):
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_upper(cls, value):
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("wecom_user_rate_limit", "admin_login_ip_limit", "admin_login_global_limit")
    @classmethod
    def _rate_parses(cls, value: str) -> str:
        parse_rate(value)
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

    @model_validator(mode="after")
    def _aibot_needs_both(self) -> Settings:
        if (self.aibot_token is None) != (self.aibot_encoding_aes_key is None):
            raise ValueError("AIBOT_TOKEN and AIBOT_ENCODING_AES_KEY must be set together "
                             "(or neither, to turn the AI bot channel off)")
        return self

    @property
    def aibot_enabled(self) -> bool:
        return self.aibot_token is not None and self.aibot_encoding_aes_key is not None

    @property
    def aibot_ws_enabled(self) -> bool:
        """The long connection: a bot id and its secret (the callback's token and key not needed)."""
        return bool(self.aibot_bot_id.strip()) and self.aibot_secret is not None

    @field_validator("database_replica_url")
    @classmethod
    def _replica_matches_primary(cls, value: str, info: ValidationInfo) -> str:
        value = value.strip()
        if value and "database_url" in info.data:  # a bad DATABASE_URL is reported on its own
            from app.db import check_replica_url

            check_replica_url(info.data["database_url"], value)
        return value

    @model_validator(mode="after")
    def _broker_defaults_to_redis(self) -> Settings:
        if not self.celery_broker_url:
            self.celery_broker_url = self.redis_url
        return self

    @property
    def blind_index_keys(self) -> list[str]:
        """BLIND_INDEX_KEY's keyring, current first: lookups try each, writes use the first."""
        return [self.blind_index_key.get_secret_value(), *self._blind_index_older]

    @property
    def previous_secret_keys(self) -> list[str]:
        return [k.strip() for k in self.secret_key_previous.get_secret_value().split(",") if k.strip()]

    @property
    def keyring(self) -> dict[str, bytes]:
        return parse_keyring(self.data_keys.get_secret_value())

    @property
    def timezone(self) -> ZoneInfo:
        return ZoneInfo(self.company_timezone)

    @property
    def user_rate_limit(self) -> tuple[int, int]:
        return parse_rate(self.wecom_user_rate_limit)

    @property
    def thresholds(self) -> tuple[int, ...]:
        return parse_thresholds(self.budget_thresholds)

    @property
    def alert_recipients(self) -> list[str]:
        return [u.strip() for u in self.alert_wecom_users.replace("|", ",").split(",") if u.strip()]


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
