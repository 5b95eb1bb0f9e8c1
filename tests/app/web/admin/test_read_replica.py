"""DATABASE_REPLICA_URL: the dashboard, the finance CSV and audit search/export read the replica;
every write (logins, budgets, the exports' own audit events) goes to the primary; a replica that
is down or goes away is logged once and the reports read the primary (no 500).

PostgreSQL, the real server: two databases, both migrated, with different content. The stand-in
"replica" is a plain database (no streaming replication here), so a write sent to it by mistake
would land and be seen: each test checks that none did (row counts of every table unchanged).
"""

from __future__ import annotations

import io
import logging
import uuid
import zipfile
from datetime import date

import pytest
import sqlalchemy as sa
from sqlalchemy import func, select

from app import migrate
from app.audit import signing as audit_signing
from app.audit.chain import EventType
from app.config import ConfigError
from app.db import Base, Database
from app.models import AdminSession, AuditEvent, Budget, UsageDaily
from app.outbox.rows import user_hash
from app.services import Services
from app.web.admin import audit_export
from app.web.admin.accounts import create_user
from app.web.factory import create_app
from tests.app.web.admin.conftest import PASSWORD, login, post
from tests.support import postgres
from tests.support.databases import PG_SERVER, _admin_engine
from tests.support.env import make_env, settings_from

PRIMARY_DEPT, REPLICA_DEPT = "dept-on-primary", "dept-on-replica"
DOWN_URL = PG_SERVER.rsplit("/", 1)[0].replace("127.0.0.1:5432", "127.0.0.1:1") + "/nothing"


def _url(name: str) -> str:
    return PG_SERVER.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture
def settings():
    """The admin conftest's, without its SQLite/PostgreSQL parameter (this module makes its own
    two databases); its autouse login-limit reset reads the Redis URL from it."""
    return settings_from(make_env())


@pytest.fixture
def databases():
    postgres.skip_if_opted_out()
    admin = _admin_engine()
    names = [f"replica_test_{uuid.uuid4().hex[:10]}_{role}" for role in ("primary", "replica")]
    try:
        with admin.connect() as conn:
            for name in names:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        postgres.unreachable(exc)
    try:
        for name in names:
            migrate.upgrade(_url(name))
        yield [_url(name) for name in names]
    finally:
        with admin.connect() as conn:
            for name in names:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _services(primary: str, replica: str) -> Services:
    """Built from the settings as production builds them (``Services.db`` reads the URL)."""
    settings = settings_from(make_env(DATABASE_URL=primary, DATABASE_REPLICA_URL=replica,
                                      SESSION_COOKIE_SECURE="false"))
    return Services(settings)


def _seed(db: Database, services: Services, dept: str, cost: str, who: str) -> None:
    """A usage rollup of ``dept`` and audit events by ``who``: what tells the servers apart."""
    with db.transaction() as session:
        session.add(UsageDaily(day=date.today(), department=dept, user_hash="a" * 64,
                               model="glm-4", calls=1, prompt_tokens=10, cached_tokens=0,
                               completion_tokens=5, cost=cost))
        for i in range(2):
            services.audit.append(session, EventType.MESSAGE_RECEIVED,
                                  actor=user_hash(services.blind_index, who),
                                  payload={"message_id": i, "server": dept})


def _counts(url: str) -> dict[str, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {table.name: conn.scalar(select(func.count()).select_from(table))
                    for table in Base.metadata.sorted_tables}
    finally:
        engine.dispose()


@pytest.fixture
def setup(databases):
    primary_url, replica_url = databases
    services = _services(primary_url, replica_url)
    replica = Database(replica_url)
    _seed(services.db, services, PRIMARY_DEPT, "1.5", "on-primary")
    _seed(replica, services, REPLICA_DEPT, "7.25", "on-replica")
    with services.db.transaction() as session:  # the admins exist on the primary only
        for name, role in (("alice", "admin"), ("fiona", "finance"), ("otto", "auditor")):
            create_user(session, name, role, PASSWORD)
    replica.dispose()
    app = create_app(services=services)
    app.config["TESTING"] = True
    yield services, app, primary_url, replica_url
    services.db.dispose()


def _signed_in(app, name: str):
    client = app.test_client()
    response = login(client, name)
    assert response.status_code == 302, response.get_data(as_text=True)
    return client


def _events_on(url: str, event_type: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.scalar(select(func.count()).select_from(AuditEvent)
                               .where(AuditEvent.event_type == event_type))
    finally:
        engine.dispose()


def test_reports_read_the_replica_and_writes_go_to_the_primary(setup):
    services, app, primary_url, replica_url = setup
    assert services.db.replica_engine is not None
    replica_before = _counts(replica_url)

    finance = _signed_in(app, "fiona")
    page = finance.get("/admin/dashboard").get_data(as_text=True)
    assert REPLICA_DEPT in page and PRIMARY_DEPT not in page
    assert 'id="total-cost">7.2500<' in page
    spend = finance.get("/admin/api/spend").get_json()
    assert spend["departments"] == [{"name": REPLICA_DEPT, "value": 7.25}]
    response = post(finance, "/admin/finance/export", {"granularity": "month"},
                    form_page="/admin/dashboard")
    text = response.get_data(as_text=True)
    assert response.status_code == 200 and REPLICA_DEPT in text and PRIMARY_DEPT not in text

    auditor = _signed_in(app, "otto")
    page = auditor.get("/admin/audit?user=on-replica").get_data(as_text=True)
    assert page.count("<td>message_received</td>") == 2
    assert auditor.get("/admin/audit?user=on-primary").get_data(as_text=True) \
        .count("<td>message_received</td>") == 0
    response = post(auditor, "/admin/audit/export",
                    {"reason": "replica read check, quarterly", "since": "", "until": "",
                     "user": "", "type": ""}, form_page="/admin/audit")
    assert response.status_code == 200
    archive = zipfile.ZipFile(io.BytesIO(response.data))
    jsonl = archive.read("audit.jsonl").decode()
    assert REPLICA_DEPT in jsonl and PRIMARY_DEPT not in jsonl
    public = audit_signing.signing_key(services.settings).public_key()
    assert audit_export.verify_export(io.BytesIO(response.data), public) == []  # a whole chain

    admin = _signed_in(app, "alice")
    response = post(admin, "/admin/budgets/new", {
        "scope": "department", "scope_value": "2", "period": "month", "limit": "100",
        "action": "warn", "thresholds": "80", "enabled": "y"})
    assert response.status_code == 302, response.get_data(as_text=True)

    # Every write went to the primary: the exports' own audit events, the sessions, the budget.
    assert _events_on(primary_url, EventType.EXPORT) == 2
    primary = Database(primary_url)
    try:
        with primary.session() as session:
            assert session.scalar(select(func.count()).select_from(AdminSession)) == 3
            assert session.scalars(select(Budget.scope_value)).all() == ["2"]
    finally:
        primary.dispose()
    assert _counts(replica_url) == replica_before  # and nothing to the replica


def test_the_replica_sessions_refuse_writes(setup):
    services, *_ = setup
    with pytest.raises(sa.exc.InternalError, match="read-only transaction"), \
            services.db.replica_reader() as session:
        session.execute(sa.text("DELETE FROM usage_daily"))


def test_a_down_replica_falls_back_to_the_primary_logged_once(databases, caplog):
    primary_url, _ = databases
    services = _services(primary_url, DOWN_URL)
    _seed(services.db, services, PRIMARY_DEPT, "1.5", "on-primary")
    with services.db.transaction() as session:
        create_user(session, "fiona", "finance", PASSWORD)
        create_user(session, "otto", "auditor", PASSWORD)
    app = create_app(services=services)
    app.config["TESTING"] = True
    try:
        caplog.set_level(logging.WARNING, logger="app.db")
        finance = _signed_in(app, "fiona")
        for _ in range(2):
            response = finance.get("/admin/dashboard")
            assert response.status_code == 200 and PRIMARY_DEPT in response.get_data(as_text=True)
        services.db.REPLICA_RETRY_S = 0.0  # tried again at each report: still logged only once
        response = post(finance, "/admin/finance/export", {"granularity": "day"},
                        form_page="/admin/dashboard")
        assert response.status_code == 200 and PRIMARY_DEPT in response.get_data(as_text=True)
        auditor = _signed_in(app, "otto")
        assert auditor.get("/admin/audit?user=on-primary").get_data(as_text=True) \
            .count("<td>message_received</td>") == 2
        response = post(auditor, "/admin/audit/export",
                        {"reason": "replica down check, quarterly", "since": "", "until": "",
                         "user": "", "type": ""}, form_page="/admin/audit")
        assert response.status_code == 200 and PRIMARY_DEPT in \
            zipfile.ZipFile(io.BytesIO(response.data)).read("audit.jsonl").decode()
        warnings = [r.getMessage() for r in caplog.records if "replica" in r.getMessage()]
        assert len(warnings) == 1 and "unreachable" in warnings[0], warnings
        assert "127.0.0.1:1" in warnings[0]
    finally:
        services.db.dispose()


def test_a_replica_that_goes_away_and_comes_back(setup, caplog):
    services, app, primary_url, replica_url = setup
    finance = _signed_in(app, "fiona")
    assert REPLICA_DEPT in finance.get("/admin/dashboard").get_data(as_text=True)
    name = replica_url.rsplit("/", 1)[1]
    admin = _admin_engine()
    try:
        caplog.set_level(logging.WARNING, logger="app.db")
        with admin.connect() as conn:  # its pooled connections die with it
            conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        response = finance.get("/admin/dashboard")
        assert response.status_code == 200
        page = response.get_data(as_text=True)
        assert PRIMARY_DEPT in page and REPLICA_DEPT not in page
        assert services.db.replica_down
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        migrate.upgrade(replica_url)
        services.db.REPLICA_RETRY_S = 0.0
        services.db._replica_down_until = 1.0  # the retry is due
        response = finance.get("/admin/dashboard")
        assert response.status_code == 200 and PRIMARY_DEPT not in response.get_data(as_text=True)
        assert not services.db.replica_down
        messages = [r.getMessage() for r in caplog.records if "replica" in r.getMessage()]
        assert [("unreachable" in m, "reachable again" in m) for m in messages] == \
            [(True, False), (False, True)], messages
    finally:
        admin.dispose()


@pytest.mark.parametrize("primary, replica, message", [
    ("sqlite:///var/x.sqlite3", "postgresql+psycopg://bot@replica/bot", "SQLite"),
    ("postgresql+psycopg://bot@primary/bot", "sqlite:///var/x.sqlite3", "same database"),
    ("postgresql+psycopg://bot@primary/bot", "not a url", "not a database URL"),
])
def test_settings_refuse_a_replica_of_another_kind(primary, replica, message):
    with pytest.raises(ConfigError, match=message) as info:
        settings_from(make_env(DATABASE_URL=primary, DATABASE_REPLICA_URL=replica))
    assert "DATABASE_REPLICA_URL" in str(info.value)


def test_no_replica_reads_the_primary(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.sqlite3'}"
    settings = settings_from(make_env(DATABASE_URL=url, DATABASE_REPLICA_URL=" "))
    assert settings.database_replica_url == ""
    db = Services(settings).db
    try:
        assert db.replica_engine is None and db.report_sessions() is db._readers
    finally:
        db.dispose()


def test_the_log_hides_the_replicas_password(tmp_path):
    db = Database(PG_SERVER, replica_url=DOWN_URL.replace("postgres@", "postgres:s3cret@"))
    try:
        assert "s3cret" not in db._replica_name() and "***" in db._replica_name()
    finally:
        db.dispose()
