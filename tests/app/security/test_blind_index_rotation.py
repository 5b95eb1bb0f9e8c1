"""BLIND_INDEX_KEY as a keyring: rows and API keys written under the old key are found once a
new key leads the ring, and still after ``keys rotate-index`` with the old key removed (each test
on SQLite and PostgreSQL: ``env`` comes from tests/support/databases.py)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

import pytest
from sqlalchemy import select

from app.accounting import Accounting, Usage, applicable_budgets, set_budget, set_price
from app.config import ConfigError
from app.db import utcnow
from app.models import ApiKey, InboundMessage, UsageDaily, UsageRecord
from app.outbox.rows import Arrival, accept_many, prepare, user_hash
from app.security import BlindIndex
from app.security.index_rotation import rotate_index
from app.services import Services
from app.web.api.keys import authenticate, create_key, key_hash
from app.wecom.messages import parse_message
from tests.support.callbacks import text_message_xml
from tests.support.env import settings_from

OLD, NEW = secrets.token_urlsafe(48), secrets.token_urlsafe(48)
USER = "zhangwei"


def services_with(env, ring: str) -> Services:
    return Services(settings_from(env, blind_index_key=ring))


def message(msg_id: int):
    return parse_message(text_message_xml("wwcorp", 1000002, "你好", USER, msg_id))


def accept(services: Services, msg_id: int):
    prepared = prepare(services.blind_index, Arrival(message(msg_id)))
    with services.db.transaction() as session:
        return accept_many(session, services.cipher, [prepared])[0]


def legacy_key(services: Services, name: str) -> str:
    """An API key as one made before migration 0009 was stored: HMAC of the key, no seal."""
    key = "sk-" + secrets.token_urlsafe(32)
    digest = hmac.new(OLD.encode(), b"api-key\x00" + key.encode(), hashlib.sha256).hexdigest()
    with services.db.transaction() as session:
        session.add(ApiKey(name=name, prefix=key[:10], key_hash=digest, enabled=True,
                           rate_limit_per_min=60, created_at=utcnow()))
    return key


def spend(services: Services, hashes: list[str]):
    with services.db.session() as session:
        rows = session.scalars(select(UsageDaily).where(UsageDaily.user_hash.in_(hashes))).all()
        return sum(r.calls for r in rows), {r.user_hash for r in rows}


def test_old_rows_are_found_through_the_ring_and_after_rotate_index(env):
    old = services_with(env, OLD)
    accept(old, 1)
    now = utcnow()
    accounting = Accounting(old.db, old.settings.timezone)
    with old.db.transaction() as session:
        set_price(session, "glm", 1, 1, 1, valid_from=now - timedelta(days=1))
        set_budget(session, "user", user_hash(old.blind_index, USER), "day", "5")
    accounting.settle(None, Usage(user_hash(old.blind_index, USER), "rd", "glm", 100, 10), now=now)
    with old.db.transaction() as session:
        _, idle = create_key(session, old.blind_index, "idle", cipher=old.cipher)
        _, busy = create_key(session, old.blind_index, "busy", cipher=old.cipher)
    used, unused = legacy_key(old, "legacy-used"), legacy_key(old, "legacy-unused")

    # A new key leads the ring: writes use it, lookups still find what the old one wrote.
    both = services_with(env, f"{NEW},{OLD}")
    ring = both.blind_index
    assert ring.key_count == 2 and ring("wecom-user", USER) != user_hash(old.blind_index, USER)
    assert not accept(both, 1).created  # WeCom's retry of a message accepted under the old key
    assert authenticate(both.db, ring, busy) and authenticate(both.db, ring, used, cipher=both.cipher)
    Accounting(both.db, both.settings.timezone).settle(
        None, Usage(ring("wecom-user", USER), "rd", "glm", 100, 10), now=now)
    assert spend(both, ring.candidates("wecom-user", USER))[0] == 2  # one row under each key

    counts = rotate_index(both, batch_size=1)
    assert counts["inbound_messages.user_hash"] == 1 and counts["inbound_messages.dedup_hash"] == 1
    assert counts["usage_records.user_hash"] == 1 and counts["budgets.scope_value"] == 1
    assert counts["api_keys.key_hash"] == 1 and counts["api_keys.unsealed_left"] == 1
    # Idempotent: nothing left to move; the unused pre-0009 key is reported, not guessed.
    assert rotate_index(both) == {"api_keys.unsealed_left": 1, "users_known": 1}

    # The old key removed: everything is found under the new one alone.
    new = services_with(env, NEW)
    current = new.blind_index("wecom-user", USER)
    assert not accept(new, 1).created
    assert spend(new, [current]) == (2, {current})  # the two days' rows added into one
    with new.db.session() as session:
        assert {r.user_hash for r in session.scalars(select(InboundMessage))} == {current}
        assert {r.user_hash for r in session.scalars(select(UsageRecord))} == {current}
        assert [b.scope_value for b in applicable_budgets(session, current, "rd")] == [current]
    assert authenticate(new.db, new.blind_index, idle)  # re-computed from its seal
    assert authenticate(new.db, new.blind_index, busy)  # moved on its use
    assert authenticate(new.db, new.blind_index, used)  # sealed on its use during the rotation
    assert authenticate(new.db, new.blind_index, unused) is None  # as the command warns


def test_an_api_key_moves_to_the_current_key_on_use(env):
    old = services_with(env, OLD)
    with old.db.transaction() as session:
        row, key = create_key(session, old.blind_index, "app", cipher=old.cipher)
    both = services_with(env, f"{NEW},{OLD}")
    assert authenticate(both.db, both.blind_index, key, cipher=both.cipher).name == "app"
    with both.db.session() as session:
        assert session.get(ApiKey, row.id).key_hash == key_hash(BlindIndex(NEW), key)
    assert authenticate(both.db, BlindIndex(NEW), key).name == "app"


def test_every_key_of_the_ring_is_checked(env):
    assert settings_from(env, blind_index_key=f" {NEW} ,\n{OLD}").blind_index_keys == [NEW, OLD]
    for ring, problem in [(f"{NEW},replace-with-a-long-random-value-0123456789abcdef", "key 2 is a placeholder"),
                          (f"{NEW},{'ab' * 32}", "key 2 is not random"),
                          (f"{NEW},{secrets.token_hex(8)}", "key 2 must be at least 32"),
                          (f"{NEW},{NEW}", "appears twice"),
                          (" , ", "must not be empty")]:
        with pytest.raises(ConfigError, match=problem) as raised:
            settings_from(env, blind_index_key=ring)
        assert NEW not in str(raised.value)  # a key is never in the message


def test_the_current_key_alone_is_what_writers_see(env):
    settings = settings_from(env, blind_index_key=f"{NEW},{OLD}")
    assert settings.blind_index_key.get_secret_value() == NEW  # e.g. the knowledge base's terms
    assert BlindIndex([NEW, OLD]).candidates("p", "v") == [BlindIndex(NEW)("p", "v"),
                                                           BlindIndex(OLD)("p", "v")]


def test_the_cli_re_keys_an_api_key_made_by_the_cli(env):
    import os
    import subprocess
    import sys

    from app.web.factory import create_app

    app = create_app(settings_from(env, blind_index_key=OLD))
    created = app.test_cli_runner().invoke(args=["apikeys", "create", "crm"])
    assert created.exit_code == 0, created.output
    key = created.stdout.strip()
    app.extensions["services"].db.dispose()

    run = subprocess.run([sys.executable, "-m", "app.cli", "keys", "rotate-index", "--batch-size", "2"],
                         env={**os.environ, **env, "BLIND_INDEX_KEY": f"{NEW},{OLD}"},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "api_keys.key_hash: 1" in run.stdout and "can be removed" in run.stdout
    assert NEW not in run.stdout + run.stderr and OLD not in run.stdout + run.stderr
    new = services_with(env, NEW)
    assert authenticate(new.db, new.blind_index, key).name == "crm"


def test_a_budget_set_under_the_old_key_still_blocks_before_rotate_index(env):
    old = services_with(env, OLD)
    with old.db.transaction() as session:
        set_price(session, "glm", 1, 1, 1, valid_from=utcnow() - timedelta(days=1))
        set_budget(session, "user", user_hash(old.blind_index, USER), "day", "0.000001")
    both = services_with(env, f"{NEW},{OLD}")
    accounting = Accounting(both.db, both.settings.timezone)
    ring = both.blind_index.candidates("wecom-user", USER)
    for _ in range(2):  # the new digest alone would never meet the budget
        assert accounting.reserve(ring[0], "rd", "glm", 10, 10).allowed
    assert accounting.reserve(ring[0], "rd", "glm", 10, 10, user_hashes=ring).allowed  # as the worker asks
    blocked = accounting.reserve(ring[0], "rd", "glm", 10, 10, user_hashes=ring)  # now over its limit
    assert not blocked.allowed and blocked.blocked_by.scope == "user"
    assert [s["budget"].scope for s in accounting.budget_status(ring[0], "rd", user_hashes=ring)] == ["user"]


def test_the_audit_search_by_user_id_finds_events_under_every_key(env):
    from flask import request

    from app.audit.chain import EventType
    from app.models import AuditEvent
    from app.web.admin.audit_export import ExportQuery
    from app.web.admin.audit_views import AuditFilterForm, _query
    from app.web.factory import create_app

    old = services_with(env, OLD)
    with old.db.transaction() as session:
        old.audit.append(session, EventType.MESSAGE_RECEIVED, actor=user_hash(old.blind_index, USER),
                         outcome="accepted", payload={"message_id": 1})
    app = create_app(settings_from(env, blind_index_key=f"{NEW},{OLD}"))
    with app.test_request_context(f"/admin/audit?user={USER}"):
        query = _query(AuditFilterForm(request.args))
    assert isinstance(query, ExportQuery) and query.actor == BlindIndex(NEW)("wecom-user", USER)
    assert query.older_actors == (user_hash(old.blind_index, USER),)
    with old.db.session() as session:
        assert len(session.scalars(select(AuditEvent).where(*query.conditions())).all()) == 1
    app.extensions["services"].db.dispose()
