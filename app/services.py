"""The long-lived objects one process needs, built once from the settings.

Both the Flask app and the Celery worker build a ``Services``; tests build their own from
their own settings, so nothing here is a module-level global. Each object is built on first
use: a process that never sends to WeCom never makes a WeCom client.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import redis

from app.config import Settings
from app.db import Database
from app.security import BlindIndex, FieldCipher
from app.wecom.crypto import WeComCrypto

if TYPE_CHECKING:
    from app.accounting import Accounting, AlertSender
    from app.intake.protocol import Intake
    from app.knowledge.caches import KnowledgeCaches
    from app.wecom.client import WeComClient


class built_once(cached_property):  # noqa: N801 - a decorator, named as cached_property is
    """``cached_property`` that builds once even when threads ask together (Python 3.12 took
    ``cached_property``'s lock away): a second ``Accounting`` would be a second ledger writer
    thread, a second ``WeComClient`` a second token cache. Once built, the attribute is read
    without the lock (the value sits in the instance's ``__dict__``)."""

    _lock = threading.RLock()  # reentrant: building accounting builds its alert sender

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        with self._lock:
            return super().__get__(instance, owner)


@dataclass
class Services:
    settings: Settings
    _db: Database | None = field(default=None, repr=False)

    @cached_property
    def db(self) -> Database:
        return self._db or Database(self.settings.database_url,
                                    replica_url=self.settings.database_replica_url or None)

    @cached_property
    def cipher(self) -> FieldCipher:
        return FieldCipher(self.settings.keyring)

    @cached_property
    def blind_index(self) -> BlindIndex:
        return BlindIndex(self.settings.blind_index_keys)

    @cached_property
    def audit(self):
        from app.audit.chain import AuditLog

        s = self.settings
        return AuditLog(self.cipher, s.secret_key.get_secret_value(), s.previous_secret_keys,
                        checkpoint_minutes=s.audit_checkpoint_minutes, head_file=s.audit_head_file,
                        stale_minutes=s.audit_stale_minutes)

    @cached_property
    def intake(self) -> Intake:
        """The callbacks' group commit: the intake server's client when one runs (gunicorn),
        else a writer thread in this process, started on first use."""
        if self.settings.intake_socket:
            from app.intake.client import RemoteIntake

            return RemoteIntake(self, self.settings.intake_socket)
        from app.intake.local import LocalIntake

        return LocalIntake(self)

    @cached_property
    def wecom_crypto(self) -> WeComCrypto:
        s = self.settings
        return WeComCrypto(s.wecom_token.get_secret_value(), s.wecom_aes_key.get_secret_value(),
                           s.wecom_corp_id)

    @cached_property
    def aibot_crypto(self) -> WeComCrypto | None:
        """The AI bot channel's crypto: its own token and key, receive id "" (None when off)."""
        s = self.settings
        if not s.aibot_enabled:
            return None
        return WeComCrypto(s.aibot_token.get_secret_value(),
                           s.aibot_encoding_aes_key.get_secret_value(), "")

    @cached_property
    def streams(self):
        from app.aibot.streams import StreamStore

        return StreamStore(self.redis, self.cipher, self.settings.aibot_stream_ttl_s)

    @cached_property
    def redis(self) -> redis.Redis:
        """REDIS_URL's client: one server, a Redis Cluster or Sentinel's primary
        (app/redis_client.py)."""
        from app import redis_client

        # Short timeouts: a dead Redis must never hold a callback past WeCom's 5 s limit.
        return redis_client.from_url(self.settings.redis_url, socket_timeout=2,
                                     socket_connect_timeout=1, health_check_interval=30)

    @cached_property
    def celery(self):
        from app.broker.task_queue import make_celery

        return make_celery(self.settings)

    @cached_property
    def publisher(self):
        """The web process's lean publisher of worker tasks (app/outbox/publisher.py)."""
        from app.outbox.publisher import TaskPublisher

        return TaskPublisher(self.celery)

    @built_once
    def wecom(self) -> WeComClient:
        """The WeCom API client of the app channel (its access token shared by every process
        through Redis)."""
        from app.wecom.client import WeComClient

        s = self.settings
        return WeComClient(s.wecom_corp_id, s.wecom_secret.get_secret_value(), s.wecom_agent_id,
                           api_base=s.wecom_api_base, redis=self.redis)

    @built_once
    def alert_sender(self) -> AlertSender:
        """Budget alerts to ``ALERT_WECOM_USERS``, the webhook and the department's heads, off
        the reply path."""
        from app.accounting import AlertSender

        s = self.settings
        return AlertSender(self.wecom, s.alert_recipients, s.alert_webhook_url,
                           s.alert_webhook_timeout_s, db=self.db, routes=self._alert_routes())

    def _alert_routes(self) -> list:
        """A department budget's alerts to its heads (ALERT_DEPARTMENT_HEADS), by the AI bot
        too where its long connection is set up."""
        if not self.settings.alert_department_heads:
            return []
        from app.accounting import DepartmentHeads
        from app.aibot.pushes import Pushes

        return [DepartmentHeads(self.wecom, Pushes(self.redis) if self.settings.aibot_ws_enabled else None)]

    @built_once
    def accounting(self) -> Accounting:
        """Budgets and usage: the process's one ledger writer (``app.accounting``)."""
        from app.accounting import Accounting

        s = self.settings
        return Accounting(self.db, s.timezone, s.currency, audit=self.audit,
                          on_alerts=self.alert_sender)

    @cached_property
    def knowledge_caches(self) -> KnowledgeCaches:
        """The knowledge base's per-process caches (term hashers, vectors, server breaker)."""
        from app.knowledge.caches import KnowledgeCaches

        return KnowledgeCaches(self)
