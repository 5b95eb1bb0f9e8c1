"""``python -m app.cli wecom-roles set | list | remove``: who may sign in with WeCom, as what."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from app.models import AdminRole


def wecom_roles_group(services: Callable) -> click.Group:
    """The ``wecom-roles`` commands over the services ``services()`` builds (app.cli's)."""

    @click.group("wecom-roles")
    def wecom_roles() -> None:
        """WeCom userids and departments mapped to admin roles (docs/wecom-signin.md)."""

    def _target(user: str | None, department: str | None) -> tuple[str, str]:
        if bool(user) == bool(department):
            click.echo("give exactly one of --user USERID or --department ID", err=True)
            sys.exit(2)
        return ("user", user) if user else ("department", department)

    @wecom_roles.command("set")
    @click.option("--user", "user", help="a WeCom userid")
    @click.option("--department", "department", help="a WeCom department id (its direct members)")
    @click.option("--role", required=True, type=click.Choice(AdminRole.ALL))
    def set_role(user, department, role) -> None:
        """Grant ROLE to a userid or a department (changing an existing row)."""
        from app.audit.chain import EventType
        from app.sso import roles
        from app.sso.signin import end_sessions_for_mapping

        kind, value = _target(user, department)
        s = services()
        try:
            with s.db.transaction() as session:
                row = roles.set_mapping(session, kind, value, role, created_by="cli")
                end_sessions_for_mapping(session, row.kind, row.value)
                s.audit.append(session, EventType.ADMIN_CHANGE, actor="cli", payload={
                    "action": "wecom_role_set", "kind": row.kind, "value": row.value, "role": role})
        except ValueError as exc:
            click.echo(str(exc), err=True)
            sys.exit(2)
        click.echo(f"{row.kind} {row.value}: {row.role}")

    @wecom_roles.command("remove")
    @click.option("--user", "user", help="a WeCom userid")
    @click.option("--department", "department", help="a WeCom department id")
    def remove(user, department) -> None:
        """Take a userid's or a department's row away (their WeCom sessions end)."""
        from app.audit.chain import EventType
        from app.sso import roles
        from app.sso.signin import end_sessions_for_mapping

        kind, value = _target(user, department)
        s = services()
        try:
            with s.db.transaction() as session:
                if not roles.remove_mapping(session, kind, value):
                    click.echo(f"no row for {kind} {value}", err=True)
                    sys.exit(1)
                value = roles.normalize(kind, value)
                end_sessions_for_mapping(session, kind, value)
                s.audit.append(session, EventType.ADMIN_CHANGE, actor="cli", payload={
                    "action": "wecom_role_remove", "kind": kind, "value": value})
        except ValueError as exc:
            click.echo(str(exc), err=True)
            sys.exit(2)
        click.echo(f"{kind} {value}: removed")

    @wecom_roles.command("list")
    def list_roles() -> None:
        from app.sso import roles

        with services().db.session() as session:
            rows = roles.all_mappings(session)
        if not rows:
            click.echo("no WeCom role mappings: nobody can sign in with WeCom")
        for row in rows:
            click.echo(f"{row.kind:<10} {row.value:<24} {row.role:<8} set by {row.created_by}")

    return wecom_roles

