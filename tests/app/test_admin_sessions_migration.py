"""Migration 0006 (server-side admin sessions) on SQLite and PostgreSQL: up, the account's
sessions go with it, down, up again; and the models match the migrated schema."""

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from app import migrate
from app.db import Base


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_admin_sessions_table_cascades_and_is_reversible(database_url):
    assert "admin_sessions" in _tables(database_url)
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "sqlite":
                conn.exec_driver_sql("PRAGMA foreign_keys=ON")
            conn.execute(sa.text(
                "INSERT INTO admin_users (id, name, password_hash, role, enabled, failed_attempts, "
                "created_at) VALUES (1, 'alice', 'x', 'admin', true, 0, CURRENT_TIMESTAMP)"))
            conn.execute(sa.text(
                "INSERT INTO admin_sessions (id, user_id, created_at, expires_at) "
                "VALUES ('abc', 1, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
            conn.execute(sa.text("DELETE FROM admin_users WHERE id = 1"))
            assert conn.execute(sa.text("SELECT count(*) FROM admin_sessions")).scalar() == 0
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert [d for d in diff if "admin_sessions" in repr(d)] == []
    finally:
        engine.dispose()
    migrate.downgrade(database_url, "0005")
    assert "admin_sessions" not in _tables(database_url)
    migrate.upgrade(database_url)
    assert "admin_sessions" in _tables(database_url)
