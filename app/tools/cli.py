"""``python -m app.cli tools add | list | remove | allow | revoke | public-key``."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from app.tools import identity, registry
from app.tools.registry import RegistryError


def _secrets(pairs: tuple[str, ...]) -> dict:
    found = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"{name or pair!r} is not NAME=VALUE", param_hint="--secret")
        found[name.strip()] = value
    return found


def _departments(raw: str) -> list[int] | None:
    if raw.strip().lower() in ("*", "all", "everyone"):
        return None
    try:
        return [int(d) for d in raw.split(",") if d.strip()]
    except ValueError:
        raise click.BadParameter("department ids separated by commas, or 'all'",
                                 param_hint="--departments") from None


def tools_group(services: Callable) -> click.Group:
    """The ``tools`` commands over the services ``services()`` builds (app.cli's)."""

    @click.group("tools")
    def tools() -> None:
        """MCP tool servers, who may use their tools, and the identity key (docs/tools.md)."""

    @tools.command()
    @click.argument("name")
    @click.argument("target")
    @click.option("--transport", type=click.Choice(registry.TRANSPORTS), default="http", show_default=True)
    @click.option("--secret", "secrets", multiple=True, metavar="NAME=VALUE",
                  help="the server's own credential: an HTTP header, or a stdio process's variable "
                       "(stored sealed); repeatable")
    def add(name: str, target: str, transport: str, secrets: tuple[str, ...]) -> None:
        """Register server NAME at TARGET (its URL, or its command line with --transport stdio)."""
        try:
            server_id = registry.add_server(services(), name, transport, target, _secrets(secrets))
        except RegistryError as exc:
            click.echo(f"refused: {exc}", err=True)
            sys.exit(2)
        click.echo(f"server {name} registered (#{server_id}); allow its tools with 'tools allow'")

    @tools.command("list")
    @click.option("--refresh", is_flag=True, help="ask each server for its tools now")
    def list_servers(refresh: bool) -> None:
        """The servers, their tools and who may use each."""
        from app.tools.catalog import Catalog
        from app.tools.mcp_calls import ToolFailure

        s = services()
        policies = registry.policies(s)
        catalog = Catalog(s)
        for server in registry.servers(s):
            click.echo(f"{server.name} [{server.transport}] {server.target}"
                       f"{'' if server.enabled else ' (disabled)'}")
            try:
                listed = catalog.refresh(server) if refresh else catalog.listed(server)
            except ToolFailure as exc:
                listed = []
                click.echo(f"  (tools unavailable: {exc.kind})")
            names = {t.name: t for t in listed}
            for tool in sorted(set(names) | {t for sid, t in policies if sid == server.id}):
                policy = policies.get((server.id, tool))
                who = "not allowed" if policy is None else ("everyone" if policy.departments is None
                                                            else "departments " + ",".join(map(str, sorted(policy.departments))))
                hint = names[tool].read_only if tool in names else None
                acts = policy.side_effect if policy and policy.side_effect is not None else (
                    None if hint is None else not hint)
                click.echo(f"  {tool}: {who}; {'acts (asks first)' if acts else 'reads'}"
                           f"{'' if tool in names else ' (not offered by the server now)'}")

    @tools.command()
    @click.argument("name")
    def remove(name: str) -> None:
        """Unregister server NAME and its policies."""
        if not registry.remove_server(services(), name):
            click.echo(f"no server named {name}", err=True)
            sys.exit(1)
        click.echo(f"server {name} removed")

    @tools.command()
    @click.argument("server")
    @click.argument("tool")
    @click.option("--departments", required=True, help="department ids (1,2,7) or 'all'")
    @click.option("--side-effect/--read-only", default=None,
                  help="whether the tool acts (then each call asks the employee first); "
                       "default: the tool's own readOnlyHint")
    def allow(server: str, tool: str, departments: str, side_effect: bool | None) -> None:
        """Offer TOOL of SERVER to the employees of --departments."""
        try:
            registry.allow(services(), server, tool, _departments(departments), side_effect)
        except RegistryError as exc:
            click.echo(f"refused: {exc}", err=True)
            sys.exit(2)
        click.echo(f"{server}.{tool} allowed for {departments}")

    @tools.command()
    @click.argument("server")
    @click.argument("tool")
    def revoke(server: str, tool: str) -> None:
        """Offer TOOL of SERVER to nobody."""
        if not registry.revoke(services(), server, tool):
            click.echo(f"no policy for {server}.{tool}", err=True)
            sys.exit(1)
        click.echo(f"{server}.{tool} revoked")

    @tools.command("public-key")
    def public_key() -> None:
        """The public half of TOOLS_SIGNING_KEY, which tool servers verify tokens with."""
        key = identity.signing_key(services().settings)
        if key is None:
            click.echo("TOOLS_SIGNING_KEY (or TOOLS_SIGNING_KEY_FILE) is not set", err=True)
            sys.exit(2)
        click.echo(identity.public_pem(key), nl=False)

    return tools
