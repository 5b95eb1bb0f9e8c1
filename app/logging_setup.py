"""Logging for the web and worker processes: one JSON object per line, with the request id.

``configure(settings)`` installs one stream handler on the root logger (``LOG_FORMAT=json``, the
default, or ``text`` for development). Every record gets ``request_id`` from a context variable
that the web process sets per request (``X-Request-ID`` or a new one) and the worker per message
(the Celery task header, else the id stored with the message), so one id follows a message
from the callback to the answer.

The redaction filter is the last line of defence for "no secrets, user ids or message text in
logs": the configured secrets (every setting marked secret, and the passwords inside URL
settings: ``app.config.secret_values``), and the user id and text of the message being handled (the
processor registers them with ``sensitive``), are replaced wherever they appear, in the message,
its arguments or a traceback; extras with a sensitive name (``content``, ``user_id``, ``token``...)
are dropped; ``access_token=...``-style query values and bearer tokens are masked.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import random
import re
import sys
from datetime import UTC, datetime

from app.config import secret_values

REDACTED = "[redacted]"
request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
_sensitive_var: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("sensitive", default=())
_secrets: tuple[str, ...] = ()

SENSITIVE_NAMES = re.compile(
    r"(content|text|message_text|reply|prompt|messages|user|userid|user_id|from_user|touser|"
    r"secret|token|password|passwd|key|authorization|cookie|email|mobile|phone|name)$", re.I)
SECRET_PATTERNS = (
    re.compile(r"(?i)\b(access_token|corpsecret|secret|token|api_key|apikey|password|key)"
               r"(=|:\s*|\"\s*:\s*\")([^&\s\"',;]+)"),
    re.compile(r"(?i)\b(bearer)\s+([A-Za-z0-9._~+/=-]+)"),
)
# Attributes every LogRecord has; anything else was passed as ``extra``.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "request_id", "taskName"}
_MIN_SECRET_LEN = 6


def new_request_id() -> str:
    """32 hex digits from a generator seeded once per process from the OS. Not from
    ``uuid4``: its ``os.urandom`` releases the GIL, and under gunicorn's threads a callback that
    lets go of the GIL mid-request waits for it behind the others (it halved a bare callback's
    rate on two cores). An id correlates log lines; it needs to be unique, not secret."""
    return f"{_ids.getrandbits(128):032x}"


_ids = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))


def clean_request_id(value: str | None) -> str | None:
    """An incoming id is kept only if it is short and plain: it is echoed, logged and stored
    with the message (32 characters)."""
    if value and re.fullmatch(r"[A-Za-z0-9_-]{1,32}", value):
        return value
    return None


@contextlib.contextmanager
def request_context(request_id: str | None):
    token = request_id_var.set(request_id)
    try:
        yield
    finally:
        request_id_var.reset(token)


@contextlib.contextmanager
def sensitive(*values: str | None):
    """Values (a user id, a message) that no log line in this block may contain."""
    extra = tuple(v for v in values if isinstance(v, str) and len(v.strip()) >= 2)
    token = _sensitive_var.set(_sensitive_var.get() + extra)
    try:
        yield
    finally:
        _sensitive_var.reset(token)


def register_secrets(*values: str) -> None:
    """Process-wide secrets (keys, tokens) to mask in every record."""
    global _secrets
    found = {v for v in values if v and len(v) >= _MIN_SECRET_LEN}
    _secrets = tuple(sorted(found | set(_secrets), key=len, reverse=True))


def redact(text: str) -> str:
    for value in (*_secrets, *sorted(_sensitive_var.get(), key=len, reverse=True)):
        if value in text:
            text = text.replace(value, REDACTED)
    text = SECRET_PATTERNS[0].sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    return SECRET_PATTERNS[1].sub(lambda m: f"{m.group(1)} {REDACTED}", text)


def _scrub(record: logging.LogRecord) -> logging.LogRecord:
    """Redact the message, its arguments and any traceback, once, as the record is made."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string must not lose the line
        message = str(record.msg)
    record.msg, record.args = redact(message), None
    if record.exc_info:
        record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        record.exc_info = None
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
    record.request_id = request_id_var.get()
    return record


def _install_record_factory() -> None:
    """Scrub in the record factory, so every handler (gunicorn's, Celery's, ours) sees it clean."""
    current = logging.getLogRecordFactory()
    if getattr(current, "_wecom_bot", False):
        return

    def factory(*args, **kwargs):
        return _scrub(current(*args, **kwargs))

    factory._wecom_bot = True
    logging.setLogRecordFactory(factory)


class RedactionFilter(logging.Filter):
    """Drops sensitive ``extra`` fields (added after the factory ran) and scrubs the others."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get()
        for name in [n for n in vars(record) if n not in _STANDARD]:
            value = getattr(record, name)
            if SENSITIVE_NAMES.search(name):
                setattr(record, name, REDACTED)
            elif isinstance(value, str):
                setattr(record, name, redact(value))
        return True


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", "request_id", ...extras, "exc"}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "msg": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and name not in entry:
                entry[name] = value if isinstance(value, int | float | bool | None) else str(value)
        if record.exc_text:
            entry["exc"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (test runners swap it)."""

    def __init__(self):
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


def configure(settings, stream=None) -> logging.Handler:
    """Install the one root handler (replacing ours from an earlier call) and the secrets."""
    s = settings
    register_secrets(*secret_values(s))  # every setting marked secret (app/config/secret_fields.py)
    _install_record_factory()
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_wecom_bot", False)]:
        root.removeHandler(handler)
    handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler._wecom_bot = True
    handler.addFilter(RedactionFilter())
    handler.setFormatter(JsonFormatter() if s.log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(s.log_level)
    return handler
