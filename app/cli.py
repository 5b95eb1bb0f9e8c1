"""Command line: ``python -m app.cli migrate`` (also the ``flask`` commands of later areas)."""

from __future__ import annotations

import sys

import click

from app.config import ConfigError


@click.group()
def cli() -> None:
    """WeCom bot administration."""


@cli.command()
@click.option("--database-url", envvar="DATABASE_URL", default=None, help="defaults to the settings'")
def migrate(database_url: str | None) -> None:
    """Bring the database schema to the newest revision."""
    from app import migrate as migrations

    if database_url is None:
        from app.config import Settings

        database_url = Settings.model_fields["database_url"].default
    migrations.upgrade(database_url)
    click.echo("database is at the newest revision")


def main() -> None:
    try:
        cli()
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
