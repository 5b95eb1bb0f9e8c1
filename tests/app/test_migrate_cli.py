"""``python -m app.cli migrate`` says what it did: the compose stack's migrate service runs it
once per ``up``, and its log is where an upgrade's schema steps are seen (docs/deploy.md)."""

from alembic.script import ScriptDirectory
from click.testing import CliRunner

from app import migrate
from app.cli import cli


def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(migrate.alembic_config("sqlite://"))


def _migrate(url: str) -> list[str]:
    done = CliRunner().invoke(cli, ["migrate", "--database-url", url])
    assert done.exit_code == 0, done.output
    # its own lines (log records may share the stream where another test set logging up)
    return [line for line in done.output.splitlines() if line.startswith("database ")]


def test_an_upgrade_is_named_and_a_second_run_does_nothing(database_url):
    head = _script().get_current_head()
    previous = _script().get_revision(head).down_revision
    assert _migrate(database_url) == [f"database is at the newest revision ({head})"]
    migrate.downgrade(database_url, previous)
    assert migrate.current_revision(database_url) == previous
    assert _migrate(database_url) == [f"database upgraded from revision {previous} to {head}",
                                      f"database is at the newest revision ({head})"]
    assert _migrate(database_url) == [f"database is at the newest revision ({head})"]


def test_an_empty_database_is_made(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
    assert migrate.current_revision(url) is None
    head = _script().get_current_head()
    assert _migrate(url)[0] == f"database upgraded from revision (empty) to {head}"
