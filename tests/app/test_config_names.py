"""Every environment variable name and every ``settings.<name>`` stays as deployments know it.

The names below were taken from ``app/config.py`` before its settings were grouped by concern
(one ``Settings`` class of 123 fields, main at 411f7b9), with the two main added since
(``MEDIA_URL_HOSTS``, ``VOICE_MAX_DURATION_S``), group chats' two (``CHAT_MEMBERS_CACHE_S``,
``GROUP_SCOPE_MAX_MEMBERS``), issue 52's two (``KB_MODE``, ``WECOM_MARKDOWN``) and issue 50's
three (``API_MAX_CONCURRENT_PER_KEY``, ``AUDIT_STALE_MINUTES``, ``WEB_ROLE``): renaming,
dropping or aliasing one of them fails here. A new setting is added to the list on purpose.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.config import Settings, load_settings
from tests.support.env import make_env, settings_from

ENVIRONMENT_NAMES = frozenset("""
ADMIN_LOCKOUT_ATTEMPTS ADMIN_LOCKOUT_MINUTES ADMIN_LOGIN_CONCURRENCY ADMIN_LOGIN_GLOBAL_LIMIT
ADMIN_LOGIN_IP_LIMIT ADMIN_SESSION_HOURS AIBOT_BOT_ID AIBOT_ENCODING_AES_KEY AIBOT_NAME
AIBOT_REFRESH_THROTTLE_S AIBOT_SECRET AIBOT_STREAM_DEADLINE_S AIBOT_STREAM_TTL_S
AIBOT_THINKING_TEXT AIBOT_TOKEN AIBOT_WS_BACKOFF_MAX_S AIBOT_WS_HEARTBEAT_S AIBOT_WS_LEASE_S
AIBOT_WS_URL ALERT_DEPARTMENT_HEADS ALERT_WEBHOOK_TIMEOUT_S ALERT_WEBHOOK_URL ALERT_WECOM_USERS
API_MAX_BODY_BYTES API_MAX_CONCURRENT_PER_KEY API_MAX_TOKENS API_REASONING ASR_API_KEY ASR_BASE_URL
ASR_LANGUAGE ASR_MODEL ASR_TIMEOUT_S
AUDIT_CHECKPOINT_MINUTES AUDIT_EXPORT_KEY AUDIT_EXPORT_KEY_FILE AUDIT_HEAD_FILE
AUDIT_RETENTION_DAYS AUDIT_STALE_MINUTES BLIND_INDEX_KEY BUDGET_RESERVATION_TTL_S BUDGET_THRESHOLDS
CALLBACK_MAX_BYTES CALLBACK_TIMESTAMP_WINDOW_S CELERY_BROKER_URL CHAT_MEMBERS_CACHE_S CLAIM_LEASE_S
COMPANY_TIMEZONE
CONVERSATION_MAX_MESSAGES CONVERSATION_TTL_S CURRENCY DATABASE_REPLICA_URL DATABASE_URL DATA_KEYS
DEPARTMENT_CACHE_S EMBEDDINGS_API_KEY EMBEDDINGS_BASE_URL EMBEDDINGS_MODEL EMBEDDINGS_TIMEOUT_S
ENGINE_KV_CACHE_BYTES ENGINE_MAX_MODEL_LEN ENGINE_MAX_NUM_SEQS ENGINE_SPECULATIVE_K FEEDBACK_CARDS
FILE_CONTEXT_MAX_CHARS FINANCE_ACCOUNTING_SUBJECT FINANCE_INVOICE_ITEM GROUP_SCOPE_MAX_MEMBERS
INFERENCE_BACKEND
INTAKE_LINGER_MS INTAKE_SOCKET KB_ANSWER_BY_QUOTING KB_CHOICE_SCORING KB_CHUNK_TOKENS
KB_DECLINE_BIAS KB_DENSE_WEIGHT KB_ENABLED KB_FALLBACK_CONTACT KB_MAX_UPLOAD_BYTES KB_MIN_RELEVANCE KB_MIN_SCORE KB_MODE
KB_MIN_SIMILARITY KB_PASSAGES_IN_PROMPT KB_QUOTE_UNIT KB_SERVER_RETRY_S KB_TABLE_HEADERS KB_TOP_K
KF_BUDGET_PERIOD KF_BUDGET_TOKENS KF_ENABLED KF_HANDOVER_WORDS KF_SERVICER_USERID KF_SYNC_LIMIT
LOG_FORMAT LOG_LEVEL
MAX_NEW_TOKENS MEDIA_MAX_BYTES MEDIA_URL_HOSTS METRICS_ADDR METRICS_PORT METRICS_TOKEN MODEL_DIR OPENAI_API_KEY
OPENAI_BASE_URL OPENAI_MODEL OPENAI_REPLY_START OPENAI_TIMEOUT_S REDIS_URL REQUEST_BODY_TIMEOUT_S
RERANK_API_KEY RERANK_BASE_URL RERANK_CANDIDATES RERANK_MODEL RERANK_TIMEOUT_S SECRET_KEY
SECRET_KEY_PREVIOUS SESSION_COOKIE_SECURE SIEM_APP_NAME SIEM_BATCH_SIZE SIEM_INTERVAL_S
SIEM_MAX_BATCHES SIEM_OTLP_CA_FILE SIEM_OTLP_CLIENT_CERT_FILE SIEM_OTLP_CLIENT_KEY_FILE
SIEM_OTLP_HEADERS SIEM_OTLP_URL SIEM_PAYLOAD_FIELDS SIEM_STREAMS SIEM_SYSLOG_CA_FILE
SIEM_SYSLOG_CLIENT_CERT_FILE SIEM_SYSLOG_CLIENT_KEY_FILE SIEM_SYSLOG_ENTERPRISE_ID
SIEM_SYSLOG_FACILITY SIEM_SYSLOG_MAX_BYTES SIEM_SYSLOG_URL SIEM_TIMEOUT_S SWEEP_INTERVAL_S
SWEEP_QUEUED_AFTER_S SYSTEM_PROMPT
TASK_MAX_RETRIES TEMPERATURE TOP_P TRUSTED_PROXIES VISION_API_KEY VISION_BASE_URL VISION_MODEL
VISION_TIMEOUT_S VOICE_MAX_DURATION_S WECOM_AES_KEY WECOM_AGENT_ID WECOM_API_BASE WECOM_CORP_ID WECOM_DUPLICATE_CHECK_S
WECOM_MARKDOWN WECOM_RATE_LIMIT_RETRY_S WECOM_SECRET WECOM_TOKEN WECOM_USER_RATE_LIMIT WELCOME_MESSAGE
WECOM_LOGIN_BASE WECOM_LOGIN_ENABLED WECOM_LOGIN_REDIRECT_URL WECOM_LOGIN_STATE_TTL_S WECOM_OAUTH_BASE
ADMIN_LOCAL_LOGIN
WEB_ROLE WORKER_HEARTBEAT_TTL_S
TOOLS_CALL_TIMEOUT_S TOOLS_CONFIRM_TTL_S TOOLS_ENABLED TOOLS_LIST_TTL_S TOOLS_MAX_SECONDS
TOOLS_MAX_STEPS TOOLS_MAX_TOKENS TOOLS_PLANNER TOOLS_RESULT_MAX_CHARS TOOLS_SIGNING_KEY
TOOLS_SIGNING_KEY_FILE TOOLS_IDENTITY_ISSUER TOOLS_IDENTITY_TTL_S
""".split())  # noqa: SIM905 - a block of names reads and diffs better than 123 strings
# ``settings.<name>`` that are computed from the variables above.
DERIVED = ("aibot_enabled", "aibot_ws_enabled", "alert_recipients", "blind_index_keys", "keyring",
           "previous_secret_keys", "siem_clear_fields", "siem_enabled", "siem_stream_names",
           "thresholds", "timezone", "user_rate_limit")


def test_the_settings_read_exactly_the_environment_names_deployments_use():
    assert len(ENVIRONMENT_NAMES) == 180  # 129, issue 50's three (docs/security.md), issue 56's 20, KB_QUOTE_UNIT
    # (docs/siem.md), 6 (docs/kf.md) and 6 (docs/wecom-signin.md), KB_DENSE_WEIGHT,
    # KB_TABLE_HEADERS (docs/retrieval.md), issue 53's 13 (docs/tools.md)
    read = {name.upper() for name in Settings.model_fields}
    assert sorted(read - ENVIRONMENT_NAMES) == [], "a new variable: add it to the list on purpose"
    assert sorted(ENVIRONMENT_NAMES - read) == [], "renamed or dropped: deployments set these"
    # Each is read under its own name: no prefix, no alias, any case.
    assert Settings.model_config.get("env_prefix", "") == ""
    assert not Settings.model_config.get("case_sensitive", False)
    aliased = [name for name, field in Settings.model_fields.items()
               if field.alias or field.validation_alias]
    assert aliased == []


def test_every_settings_attribute_callers_read_is_still_there():
    settings = settings_from(make_env())
    for name in (*(n.lower() for n in ENVIRONMENT_NAMES), *DERIVED):
        getattr(settings, name)


# One variable of each group, set in the environment, arrives in its attribute.
FROM_THE_ENVIRONMENT = {
    "WECOM_DUPLICATE_CHECK_S": ("wecom_duplicate_check_s", "77", 77),
    "AIBOT_NAME": ("aibot_name", "机器人", "机器人"),
    "DATABASE_URL": ("database_url", "sqlite:///elsewhere.sqlite3", "sqlite:///elsewhere.sqlite3"),
    "CELERY_BROKER_URL": ("celery_broker_url", "amqp://127.0.0.1:5672//", "amqp://127.0.0.1:5672//"),
    "TRUSTED_PROXIES": ("trusted_proxies", "2", 2),
    "API_MAX_TOKENS": ("api_max_tokens", "99", 99),
    "ADMIN_SESSION_HOURS": ("admin_session_hours", "3", 3),
    "SWEEP_INTERVAL_S": ("sweep_interval_s", "7.5", 7.5),
    "AUDIT_CHECKPOINT_MINUTES": ("audit_checkpoint_minutes", "5", 5),
    "CURRENCY": ("currency", "usd", "USD"),
    "LOG_LEVEL": ("log_level", "debug", "DEBUG"),
    "ENGINE_MAX_NUM_SEQS": ("engine_max_num_seqs", "8", 8),
    "OPENAI_MODEL": ("openai_model", "glm-4.6", "glm-4.6"),
    "KB_TOP_K": ("kb_top_k", "6", 6),
    "RERANK_CANDIDATES": ("rerank_candidates", "30", 30),
    "ASR_LANGUAGE": ("asr_language", "zh", "zh"),
    "WECOM_LOGIN_STATE_TTL_S": ("wecom_login_state_ttl_s", "120", 120),
}


@pytest.fixture
def clean_env(monkeypatch):
    for key in ENVIRONMENT_NAMES:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir("/")  # no stray .env
    return monkeypatch


def test_each_group_reads_its_variables_from_the_environment(clean_env):
    for key, value in {**make_env(), **{k: v[1] for k, v in FROM_THE_ENVIRONMENT.items()}}.items():
        clean_env.setenv(key, value)
    settings = load_settings()
    for attribute, _, expected in FROM_THE_ENVIRONMENT.values():
        assert getattr(settings, attribute) == expected, attribute


def test_secrets_dir_is_read_from_the_environment(tmp_path):
    """SECRETS_DIR (read when the settings module loads): a file per secret, named after it."""
    env = make_env()
    (tmp_path / "wecom_token").write_text(env.pop("WECOM_TOKEN"))
    run = subprocess.run(
        [sys.executable, "-c", "from app.config import load_settings; "
                               "print(len(load_settings(_env_file=None).wecom_token.get_secret_value()))"],
        env={**{k: v for k, v in os.environ.items() if k not in ENVIRONMENT_NAMES}, **env,
             "SECRETS_DIR": str(tmp_path)},
        cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(len((tmp_path / "wecom_token").read_text()))
