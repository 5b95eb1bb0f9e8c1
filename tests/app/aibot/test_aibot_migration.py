"""Migration 0005 (the AI bot's stream id) on SQLite and PostgreSQL: up, unique, down, up again."""

import pytest
import sqlalchemy as sa

from app import migrate


def _columns(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return {c["name"] for c in sa.inspect(engine).get_columns("inbound_messages")}
    finally:
        engine.dispose()


def _insert(conn, dedup: str, stream_id):
    conn.execute(sa.text(
        "INSERT INTO inbound_messages (dedup_hash, channel, user_hash, msg_type, wecom_create_time, "
        "status, attempts, chunks_sent, created_at, updated_at, stream_id) VALUES "
        "(:d, 'aibot', 'u', 'text', 0, 'queued', 0, 0, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, :s)"),
        {"d": dedup, "s": stream_id})


def test_stream_id_column_is_unique_and_reversible(database_url):
    assert "stream_id" in _columns(database_url)
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as conn:
            _insert(conn, "a", "S1")
            _insert(conn, "b", None)  # the app channel's rows have none
            _insert(conn, "c", None)
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            _insert(conn, "d", "S1")
    finally:
        engine.dispose()
    migrate.downgrade(database_url, "0004")
    assert "stream_id" not in _columns(database_url)
    migrate.upgrade(database_url)
    assert "stream_id" in _columns(database_url)
