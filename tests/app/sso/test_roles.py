"""Role mappings (app/sso/roles.py), the ``wecom-roles`` commands, and the settings' rule that
someone can always sign in."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from app.config import ConfigError
from app.models import AdminUser, AuditEvent
from app.services import Services
from app.sso import roles
from app.sso.cli import wecom_roles_group
from app.sso.signin import UNUSABLE_HASH, account_name
from tests.support.env import make_env, settings_from


def test_values_are_checked_and_normalized():
    assert roles.normalize("user", " ZhangWei ") == "zhangwei"
    assert roles.normalize("department", "007") == "7"
    for kind, value in (("user", "a b"), ("user", ""), ("user", "x" * 65), ("department", "rd"),
                        ("department", "0"), ("department", "-3"), ("team", "1")):
        with pytest.raises(ValueError):
            roles.normalize(kind, value)


def test_a_userid_row_wins_and_departments_must_agree(db):
    with db.transaction() as session:
        roles.set_mapping(session, "department", "2", "admin", "test")
        roles.set_mapping(session, "department", "3", "auditor", "test")
        roles.set_mapping(session, "user", "lina", "finance", "test")
        with pytest.raises(ValueError, match="role must be one of"):
            roles.set_mapping(session, "user", "lina", "root", "test")
    with db.session() as session:
        assert roles.user_role(session, "LINA") == "finance"
        assert roles.user_role(session, "wangfang") is None
        assert roles.department_role(session, [2]) == roles.RoleDecision("admin", "ok", "department:2")
        assert roles.department_role(session, [2, 3]).outcome == "ambiguous"
        assert roles.department_role(session, [4]).outcome == "no_role"
        assert roles.department_role(session, []).outcome == "no_role"
    with db.transaction() as session:
        roles.set_mapping(session, "department", "3", "admin", "test")  # changes the row
    with db.session() as session:
        assert roles.department_role(session, [2, 3]).role == "admin"
        assert len(roles.all_mappings(session)) == 3


def test_the_cli_sets_lists_and_removes_and_audits(database_url, db):
    services = Services(settings_from(make_env(DATABASE_URL=database_url)), db)
    group, runner = wecom_roles_group(lambda: services), CliRunner()
    assert "nobody can sign in" in runner.invoke(group, ["list"]).output
    done = runner.invoke(group, ["set", "--user", "ZhangWei", "--role", "admin"])
    assert done.exit_code == 0 and "user zhangwei: admin" in done.output
    assert runner.invoke(group, ["set", "--department", "7", "--role", "finance"]).exit_code == 0
    listed = runner.invoke(group, ["list"]).output
    assert "zhangwei" in listed and "finance" in listed and "set by cli" in listed
    assert runner.invoke(group, ["set", "--user", "a", "--department", "7", "--role", "admin"]).exit_code == 2
    assert runner.invoke(group, ["set", "--department", "rd", "--role", "admin"]).exit_code == 2
    assert runner.invoke(group, ["set", "--user", "x", "--role", "root"]).exit_code == 2
    assert runner.invoke(group, ["remove", "--user", "zhangwei"]).exit_code == 0
    assert runner.invoke(group, ["remove", "--user", "zhangwei"]).exit_code == 1
    with db.session() as session:
        assert [(m.kind, m.value) for m in roles.all_mappings(session)] == [("department", "7")]
        actions = [e.actor for e in session.scalars(select(AuditEvent).where(
            AuditEvent.event_type == "admin_change"))]
    assert actions == ["cli"] * 3


def test_a_wecom_account_name_and_its_hash_open_nothing_by_password(db):
    from app.web.admin.accounts import authenticate

    with db.transaction() as session:
        session.add(AdminUser(name=account_name("zhangwei"), role="admin", password_hash=UNUSABLE_HASH,
                              enabled=True, failed_attempts=0))
    for guess in ("", UNUSABLE_HASH, "!wecom-sign-in", "correct horse battery"):
        assert authenticate(db, "wecom:zhangwei", guess, max_attempts=10).outcome == "bad_password"


def test_password_login_off_needs_wecom_sign_in():
    with pytest.raises(ConfigError, match="ADMIN_LOCAL_LOGIN=false needs WECOM_LOGIN_ENABLED=true"):
        settings_from(make_env(ADMIN_LOCAL_LOGIN="false", WECOM_LOGIN_ENABLED="false"))
    with pytest.raises(ConfigError, match="WECOM_LOGIN_BASE"):
        settings_from(make_env(WECOM_LOGIN_BASE="ftp://login.example"))
    settings = settings_from(make_env(ADMIN_LOCAL_LOGIN="false", WECOM_LOGIN_ENABLED="true",
                                      WECOM_LOGIN_REDIRECT_URL="https://admin.example.com/admin/login/wecom/callback/"))
    assert settings.wecom_login_redirect_url == "https://admin.example.com/admin/login/wecom/callback"
