"""Alembic environment: the app's metadata, the URL from ``DATABASE_URL`` (or the caller)."""

from __future__ import annotations

import os

from alembic import context

import app.models  # noqa: F401 - registers every table on Base.metadata
import app.tools.models  # noqa: F401 - the tool servers' tables
from app.db import Base, make_engine

config = context.config


def database_url() -> str:
    url = config.attributes.get("database_url") or os.environ.get("DATABASE_URL")
    if url:
        return url
    from app.config import Settings

    return Settings.model_fields["database_url"].default


def run_migrations_offline() -> None:
    context.configure(url=database_url(), target_metadata=Base.metadata, literal_binds=True,
                      render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(database_url())
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


def _run(connection) -> None:
    # render_as_batch lets later revisions ALTER tables on SQLite too.
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True,
                      compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
