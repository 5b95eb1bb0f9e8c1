"""The registered tool servers and their policies (``tool_servers``, ``tool_policies``), and
which tools an asker's departments may see.

Deny by default: a tool is offered only where an admin allowed it (``allow``) for one of the
asker's departments or for everyone. Whether it acts (and so asks before running) is the
admin's word, else the tool's own ``readOnlyHint`` (a tool that does not say it only reads is
taken to act).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from sqlalchemy import delete, select

from app.tools.models import EVERYONE, ToolPolicy, ToolServer

TRANSPORTS = ("http", "stdio")
NAME = re.compile(r"^[a-z][a-z0-9_-]{0,30}$")  # the server's part of a tool's name to the model
SECRETS = (ToolServer.__tablename__, "secrets_enc")


class RegistryError(ValueError):
    """A registration or policy the registry refuses, with the reason."""


@dataclass(frozen=True)
class Server:
    id: int
    name: str
    transport: str
    target: str
    secrets: dict = field(default_factory=dict, repr=False)  # HTTP headers, or a stdio env
    enabled: bool = True
    version: str = ""  # changes with the row: the tool list cache's key


@dataclass(frozen=True)
class Policy:
    departments: frozenset[int] | None  # None: everyone
    side_effect: bool | None

    def allows(self, departments) -> bool:
        return self.departments is None or bool(self.departments & set(departments))


def _check(name: str, transport: str, target: str, secrets: dict) -> None:
    if not NAME.fullmatch(name or ""):
        raise RegistryError("name: lower-case letters, digits, - and _, at most 31, a letter first")
    if transport not in TRANSPORTS:
        raise RegistryError(f"transport must be one of {', '.join(TRANSPORTS)}")
    if transport == "http" and not re.match(r"^https?://[^\s/]+", target or ""):
        raise RegistryError("an http server's target is its URL (http:// or https://)")
    if transport == "stdio" and not (target or "").strip():
        raise RegistryError("a stdio server's target is its command line")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in secrets.items()):
        raise RegistryError("secrets are name=value strings")


def add_server(services, name: str, transport: str, target: str, secrets: dict | None = None) -> int:
    """Register a server; its secrets sealed. RegistryError if the name is taken or bad."""
    secrets = secrets or {}
    _check(name, transport, target, secrets)
    with services.db.transaction() as session:
        if session.scalar(select(ToolServer.id).where(ToolServer.name == name)) is not None:
            raise RegistryError(f"a server named {name!r} is registered already")
        row = ToolServer(name=name, transport=transport, target=target.strip())
        session.add(row)
        session.flush()
        if secrets:
            row.secrets_enc = services.cipher.encrypt(json.dumps(secrets), *SECRETS, row.id)
        return row.id


def remove_server(services, name: str) -> bool:
    with services.db.transaction() as session:
        server_id = session.scalar(select(ToolServer.id).where(ToolServer.name == name))
        if server_id is None:
            return False
        session.execute(delete(ToolPolicy).where(ToolPolicy.server_id == server_id))
        session.execute(delete(ToolServer).where(ToolServer.id == server_id))
        return True


def servers(services, *, enabled_only: bool = False) -> list[Server]:
    with services.db.reader() as session:
        query = select(ToolServer).order_by(ToolServer.name)
        if enabled_only:
            query = query.where(ToolServer.enabled.is_(True))
        rows = session.scalars(query).all()
        return [_server(services, row) for row in rows]


def server(services, name: str) -> Server | None:
    with services.db.reader() as session:
        row = session.scalar(select(ToolServer).where(ToolServer.name == name))
        return _server(services, row) if row is not None else None


def _server(services, row: ToolServer) -> Server:
    secrets = json.loads(services.cipher.decrypt(row.secrets_enc, *SECRETS, row.id)) if row.secrets_enc else {}
    return Server(row.id, row.name, row.transport, row.target, secrets, row.enabled,
                  f"{row.id}-{row.updated_at.timestamp():.0f}" if row.updated_at else str(row.id))


def allow(services, server_name: str, tool: str, departments: list[int] | None,
          side_effect: bool | None = None) -> None:
    """Offer ``tool`` to ``departments`` (None: everyone); ``side_effect`` None: the tool's hint."""
    if not tool or len(tool) > 128:
        raise RegistryError("a tool name of 1 to 128 characters")
    if departments is not None and not departments:
        raise RegistryError("name at least one department, or everyone")
    value = EVERYONE if departments is None else ",".join(str(int(d)) for d in sorted(set(departments)))
    if len(value) > 1024:
        raise RegistryError("too many departments")
    with services.db.transaction() as session:
        server_id = session.scalar(select(ToolServer.id).where(ToolServer.name == server_name))
        if server_id is None:
            raise RegistryError(f"no server named {server_name!r}")
        row = session.get(ToolPolicy, (server_id, tool))
        if row is None:
            session.add(ToolPolicy(server_id=server_id, tool=tool, departments=value, side_effect=side_effect))
        else:
            row.departments, row.side_effect = value, side_effect


def revoke(services, server_name: str, tool: str) -> bool:
    with services.db.transaction() as session:
        server_id = session.scalar(select(ToolServer.id).where(ToolServer.name == server_name))
        if server_id is None:
            return False
        return session.execute(delete(ToolPolicy).where(ToolPolicy.server_id == server_id,
                                                        ToolPolicy.tool == tool)).rowcount > 0


def policies(services) -> dict[tuple[int, str], Policy]:
    """Every policy by (server id, tool)."""
    with services.db.reader() as session:
        rows = session.scalars(select(ToolPolicy)).all()
        return {(r.server_id, r.tool): Policy(None if r.departments == EVERYONE else
                                              frozenset(int(d) for d in r.departments.split(",") if d),
                                              r.side_effect) for r in rows}
