"""Which WeCom members may sign in to the admin site, and with which role.

An admin sets rows (admin page ``/admin/wecom-roles`` or ``python -m app.cli wecom-roles``):
a userid, or a department id whose direct members get the role. ``resolve_role``: the userid's
own row wins; else the rows of the member's departments, when they agree. Departments that
grant different roles to one member are refused as ambiguous rather than guessed: the admin
settles it with a row for that userid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import AdminRole, WeComRoleMapping

KINDS = ("user", "department")
# WeCom userids: 1-64 letters, digits and _ - @ . (matched case-insensitively, kept lower case)
USERID = re.compile(r"^[A-Za-z0-9_\-@.]{1,64}$")


@dataclass(frozen=True)
class RoleDecision:
    role: str | None
    outcome: str  # ok | no_role | ambiguous
    source: str = ""  # "user" or "department:<id>"


def normalize(kind: str, value: str) -> str:
    """The stored form of a mapping's value; ValueError says what is wrong."""
    value = (value or "").strip()
    if kind == "user":
        if not USERID.match(value):
            raise ValueError("a WeCom userid is 1-64 letters, digits or _ - @ .")
        return value.lower()
    if kind == "department":
        if not value.isdigit() or not 0 < int(value) < 2**32:
            raise ValueError("a department id is a positive number")
        return str(int(value))
    raise ValueError(f"kind must be one of {', '.join(KINDS)}")


def set_mapping(session: Session, kind: str, value: str, role: str, created_by: str) -> WeComRoleMapping:
    """Create the row, or change the role of the existing one for this userid/department."""
    value = normalize(kind, value)
    if role not in AdminRole.ALL:
        raise ValueError(f"role must be one of {', '.join(AdminRole.ALL)}")
    row = session.scalar(select(WeComRoleMapping).where(WeComRoleMapping.kind == kind,
                                                        WeComRoleMapping.value == value))
    if row is None:
        row = WeComRoleMapping(kind=kind, value=value, role=role, created_by=created_by[:80])
        session.add(row)
    else:
        row.role, row.created_by = role, created_by[:80]
    session.flush()
    return row


def remove_mapping(session: Session, kind: str, value: str) -> bool:
    row = session.scalar(select(WeComRoleMapping).where(WeComRoleMapping.kind == kind,
                                                        WeComRoleMapping.value == normalize(kind, value)))
    if row is None:
        return False
    session.delete(row)
    session.flush()
    return True


def all_mappings(session: Session) -> list[WeComRoleMapping]:
    return list(session.scalars(select(WeComRoleMapping).order_by(WeComRoleMapping.kind,
                                                                  WeComRoleMapping.value)))


def user_role(session: Session, userid: str) -> str | None:
    """The role of the userid's own row, if there is one."""
    return session.scalar(select(WeComRoleMapping.role).where(
        WeComRoleMapping.kind == "user", WeComRoleMapping.value == userid.lower()))


def department_role(session: Session, departments: list[int]) -> RoleDecision:
    """The role the member's departments grant together."""
    wanted = [str(int(d)) for d in departments]
    rows = list(session.execute(select(WeComRoleMapping.value, WeComRoleMapping.role).where(
        WeComRoleMapping.kind == "department", WeComRoleMapping.value.in_(wanted)))) if wanted else []
    roles = {role for _, role in rows}
    if not roles:
        return RoleDecision(None, "no_role")
    if len(roles) > 1:
        return RoleDecision(None, "ambiguous")
    return RoleDecision(roles.pop(), "ok", "department:" + ",".join(sorted(v for v, _ in rows)))
