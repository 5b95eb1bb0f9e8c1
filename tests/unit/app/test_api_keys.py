"""API keys: only the HMAC is stored, the key authenticates until disabled."""

from __future__ import annotations

import pytest

from app import migrate
from app.api.keys import authenticate, create_key, disable_key, key_hash, list_keys
from app.db import Database
from app.models import ApiKey
from app.security import BlindIndex

INDEX = BlindIndex("k" * 32)


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    migrate.upgrade(url)
    database = Database(url)
    yield database
    database.dispose()


def test_a_key_is_stored_as_its_hmac_only(db):
    with db.transaction() as session:
        row, key = create_key(session, INDEX, "reporting", 7)
    assert key.startswith("sk-") and len(key) > 40
    with db.session() as session:
        stored = session.get(ApiKey, row.id)
        assert stored.key_hash == key_hash(INDEX, key) and key not in stored.key_hash
        assert stored.prefix == key[:10] and stored.rate_limit_per_min == 7


def test_authenticate_then_disable(db):
    with db.transaction() as session:
        _, key = create_key(session, INDEX, "crm")
    caller = authenticate(db, INDEX, key)
    assert caller is not None and caller.name == "crm" and caller.actor == "api_key:crm"
    assert authenticate(db, INDEX, key + "x") is None
    assert authenticate(db, INDEX, None) is None
    assert authenticate(db, BlindIndex("o" * 32), key) is None  # another server's index key
    with db.session() as session:
        assert list_keys(session)[0].last_used_at is not None
    with db.transaction() as session:
        disable_key(session, "crm")
    assert authenticate(db, INDEX, key) is None


def test_names_are_unique_and_limits_positive(db):
    with db.transaction() as session:
        create_key(session, INDEX, "crm")
    with pytest.raises(ValueError, match="exists"), db.transaction() as session:
        create_key(session, INDEX, "crm")
    with pytest.raises(ValueError, match="rate limit"), db.transaction() as session:
        create_key(session, INDEX, "other", 0)
