"""Budgets on both databases: reservations under concurrency, alerts once, usage rollups."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import func, select

from app.accounting import Accounting, AlertSender, Usage, set_budget, set_price
from app.models import (
    AuditEvent,
    BudgetAlert,
    BudgetPeriod,
    BudgetReservation,
    UsageDaily,
    UsageRecord,
)

TZ = ZoneInfo("Asia/Shanghai")
# 10 CNY per million input tokens, 2 cached, 30 output: a call of 1000 in / 500 out = 0.025 CNY.
PRICES = (Decimal(10), Decimal(2), Decimal(30))


@pytest.fixture
def accounting(services):
    raised = []
    acc = Accounting(services.db, TZ, audit=services.audit, on_alerts=raised.extend)
    acc.raised = raised
    with services.db.transaction() as session:
        set_price(session, "glm-4", *PRICES)
    return acc


def usage(user="u1", dept="d1", prompt=1000, completion=500, cached=0):
    return Usage(user_hash=user, department=dept, model="glm-4", prompt_tokens=prompt,
                 completion_tokens=completion, cached_tokens=cached)


def test_cost_and_rollup(services, accounting):
    accounting.settle(None, usage())
    accounting.settle(None, usage(prompt=1000, cached=400, completion=100))
    with services.db.session() as session:
        costs = sorted(session.scalars(select(UsageRecord.cost)))
        daily = session.scalars(select(UsageDaily)).one()
    assert costs == [Decimal("0.009800"), Decimal("0.025000")]
    assert (daily.calls, daily.prompt_tokens, daily.cached_tokens, daily.completion_tokens) == (2, 2000, 400, 600)
    assert daily.cost == Decimal("0.034800") and daily.department == "d1"


def test_price_versions(services, accounting):
    later = datetime(2030, 1, 1, tzinfo=TZ)
    with services.db.transaction() as session:
        set_price(session, "glm-4", 1, 1, 1, valid_from=later)
    accounting.settle(None, usage(), now=later)
    accounting.settle(None, usage())
    with services.db.session() as session:
        assert sorted(session.scalars(select(UsageRecord.cost))) == [Decimal("0.001500"), Decimal("0.025000")]


def test_block_at_100_percent_and_release(services, accounting):
    with services.db.transaction() as session:
        set_budget(session, "user", "u1", "day", "0.05")
    first = accounting.reserve("u1", "d1", "glm-4", 1000, 500)
    assert first.allowed and first.amount == Decimal("0.025000")
    accounting.release(first)
    accounting.release(first)  # twice is harmless
    for _ in range(2):
        admission = accounting.reserve("u1", "d1", "glm-4", 1000, 500)
        accounting.settle(admission, usage())
    blocked = accounting.reserve("u1", "d1", "glm-4", 1000, 500)
    assert not blocked.allowed and blocked.blocked_by.scope == "user"
    assert accounting.reserve("u2", "d1", "glm-4", 1000, 500).allowed  # another user
    with services.db.session() as session:
        assert session.scalar(select(func.count()).select_from(BudgetReservation)) == 0
        row = session.scalars(select(BudgetPeriod)).one()
        assert row.spent == Decimal("0.050000")


def test_warn_budget_lets_it_pass(services, accounting):
    with services.db.transaction() as session:
        set_budget(session, "global", "", "month", "0.01", action="warn")
    accounting.settle(accounting.reserve("u1", "d1", "glm-4", 1000, 500), usage())
    assert accounting.reserve("u1", "d1", "glm-4", 1000, 500).allowed
    assert [a.threshold for a in accounting.raised] == [50, 80, 100]


def test_concurrent_requests_overspend_by_at_most_one_worst_case(services, accounting):
    limit = Decimal("1.000000")
    worst = Decimal("0.025000")
    with services.db.transaction() as session:
        budget = set_budget(session, "department", "d1", "day", limit)
    # Nearly spent: 0.99 already.
    accounting.settle(None, Usage("seed", "d1", "glm-4", 99_000, 0))
    barrier = threading.Barrier(50)

    def one(i):
        barrier.wait()
        admission = accounting.reserve(f"u{i}", "d1", "glm-4", 1000, 500)
        if admission.allowed:
            accounting.settle(admission, usage(user=f"u{i}"))  # the worst case really happens
        return admission.allowed

    with ThreadPoolExecutor(50) as pool:
        admitted = sum(pool.map(one, range(50)))
    with services.db.session() as session:
        row = session.scalars(select(BudgetPeriod).where(BudgetPeriod.budget_id == budget.id)).one()
        alerts = sorted(session.scalars(select(BudgetAlert.threshold)))
        audited = session.scalar(select(func.count()).select_from(AuditEvent)
                                 .where(AuditEvent.event_type == "budget_alert"))
    assert 1 <= admitted <= 2
    assert row.spent <= limit + worst and row.reserved == 0
    assert alerts == [50, 80, 100] and audited == 3
    assert sorted(a.threshold for a in accounting.raised) == [50, 80, 100]


@pytest.mark.parametrize("seed_tokens", [99_000, 90_000])
def test_50_requests_at_the_edge_of_a_company_and_a_department_budget(services, accounting,
                                                                      seed_tokens):
    """50 requests at once against a company-wide and a department budget, through two
    ``Accounting`` objects (two group-commit writers, as two worker processes have): each budget
    ends at most one request's worst case over its limit, nothing stays reserved, and the
    budgets' spend is exactly the usage rows' cost. Seeded 0.99 of the department's 1.00 only
    the first is admitted; seeded 0.90, four are (0.90, 0.925, 0.95, 0.975 < 1)."""
    worst = Decimal("0.025000")
    with services.db.transaction() as session:
        department = set_budget(session, "department", "d1", "day", "1").id
        company = set_budget(session, "global", "", "month", "1.5").id
    accounting.settle(None, Usage("seed", "d1", "glm-4", seed_tokens, 0))
    other = Accounting(services.db, TZ, audit=services.audit)
    barrier = threading.Barrier(50)

    def one(i):
        acc = accounting if i % 2 else other
        barrier.wait()
        admission = acc.reserve(f"u{i}", "d1", "glm-4", 1000, 500)
        if admission.allowed:
            acc.settle(admission, usage(user=f"u{i}"))  # the worst case really happens
        else:
            assert admission.blocked_by.id == department
        return admission.allowed

    with ThreadPoolExecutor(50) as pool:
        admitted = sum(pool.map(one, range(50)))
    with services.db.session() as session:
        rows = {r.budget_id: r for r in session.scalars(select(BudgetPeriod))}
        charged = session.scalar(select(func.sum(UsageRecord.cost)))
        left = session.scalar(select(func.count()).select_from(BudgetReservation))
    assert admitted == (1 if seed_tokens == 99_000 else 4)
    assert rows[department].spent <= Decimal(1) + worst
    assert rows[department].spent == rows[company].spent == charged
    assert rows[department].reserved == rows[company].reserved == 0 and left == 0


def test_a_call_that_fails_in_a_batch_fails_alone(services, accounting):
    """Calls written together that include one the database refuses (a message id beyond
    BIGINT): that one raises, every other is recorded and charged."""
    with services.db.transaction() as session:
        set_budget(session, "global", "", "day", "100")
    barrier = threading.Barrier(8)

    def one(i):
        admission = accounting.reserve(f"u{i}", "d1", "glm-4", 1000, 500)
        call = usage(user=f"u{i}")
        call.message_id = 2**70 if i == 3 else i
        barrier.wait()
        try:
            accounting.settle(admission, call)
        except Exception:  # noqa: BLE001 - the one refused
            return False
        return True

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(one, range(8)))
    assert outcomes == [i != 3 for i in range(8)]
    with services.db.session() as session:
        ids = sorted(session.scalars(select(UsageRecord.message_id)))
        row = session.scalars(select(BudgetPeriod)).one()
        left = session.scalar(select(func.count()).select_from(BudgetReservation))
    assert ids == [0, 1, 2, 4, 5, 6, 7]
    # The refused call's reservation stays (charged its worst case when it expires).
    assert row.spent == 7 * Decimal("0.025000") and row.reserved == Decimal("0.025000") and left == 1


def test_accounting_inside_a_sqlite_write_transaction_is_refused_not_a_hang(services, accounting):
    with services.db.transaction() as session:
        set_budget(session, "global", "", "day", "0.01")
        if services.db.engine.dialect.name == "sqlite":
            with pytest.raises(RuntimeError, match="wait for itself"):
                accounting.reserve("u1", "d1", "glm-4", 1000, 500)
        else:  # the writer's transaction waits for nothing of this one (nor sees its budget)
            assert accounting.reserve("u1", "d1", "glm-4", 1000, 500).allowed


def test_each_threshold_alert_once_under_concurrency(services, accounting):
    with services.db.transaction() as session:
        set_budget(session, "global", "", "week", "0.5", action="warn", thresholds="10,50,80,100")
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: accounting.settle(accounting.reserve(f"u{i}", "", "glm-4", 1000, 500),
                                                  usage(user=f"u{i}", dept="")), range(40)))
    with services.db.session() as session:
        alerts = sorted(session.scalars(select(BudgetAlert.threshold)))
    assert alerts == [10, 50, 80, 100]
    assert sorted(a.threshold for a in accounting.raised) == [10, 50, 80, 100]


def test_alert_delivery_to_wecom_and_webhook(services, accounting):
    sent, posted = [], []

    class WeCom:
        def send(self, touser, kind, content, **_):
            sent.append((touser, content))

    def post(url, data, timeout, headers):
        posted.append((url, data, timeout))
        return type("R", (), {"status_code": 200})()

    sender = AlertSender(WeCom(), ["admin1", "admin2"], "http://hooks.test/x", 2.0,
                         db=services.db, http_post=post)
    accounting.on_alerts = sender
    with services.db.transaction() as session:
        set_budget(session, "department", "d1", "month", "0.04")
    accounting.settle(None, usage())
    for thread in threading.enumerate():
        if thread.name == "budget-alerts":
            thread.join(5)
    assert sent and sent[0][0] == "admin1|admin2" and "50%" in sent[0][1]
    assert posted[0][0] == "http://hooks.test/x" and posted[0][2] == 2.0
    with services.db.session() as session:
        assert session.scalars(select(BudgetAlert.delivered)).one() == "wecom,webhook"


def test_stale_reservations_are_charged_not_released(services, accounting):
    # A reservation nobody settled (a worker killed mid-call, a charge that failed) is charged
    # its worst case: never a way to use the model for free.
    with services.db.transaction() as session:
        set_budget(session, "global", "", "day", "1")
    accounting.reserve("u1", "d1", "glm-4", 1000, 500)
    assert accounting.expire_reservations(3600) == 0
    assert accounting.expire_reservations(-1) == 1
    assert accounting.expire_reservations(-1) == 0
    with services.db.session() as session:
        row = session.scalars(select(BudgetPeriod)).one()
        assert session.scalar(select(func.count()).select_from(BudgetReservation)) == 0
    assert (row.reserved, row.spent) == (0, Decimal("0.025000"))


def test_a_failed_charge_is_charged_when_its_reservation_expires(services, accounting, monkeypatch):
    with services.db.transaction() as session:
        set_budget(session, "user", "u1", "day", "0.02")
    admission = accounting.reserve("u1", "d1", "glm-4", 1000, 500)

    def broken(*args, **kwargs):
        raise RuntimeError("database went away mid-charge")

    monkeypatch.setattr("app.accounting.batch.roll_up_usage", broken)
    with pytest.raises(RuntimeError):
        accounting.settle(admission, usage())
    monkeypatch.undo()
    accounting.expire_reservations(-1)
    assert not accounting.reserve("u1", "d1", "glm-4", 1000, 500).allowed  # 0.025 charged > 0.02


def test_settle_charges_the_larger_of_reported_and_estimated_tokens(services, accounting):
    with services.db.transaction() as session:
        set_budget(session, "global", "", "day", "10")
    # The model server reported no usage at all, under a model name without a price: the call
    # is charged the reservation's prompt estimate and the answer's estimate, at glm-4's price.
    admission = accounting.reserve("u1", "d1", "glm-4", 1000, 500)
    silent = Usage("u1", "d1", "renamed-by-server", 0, 0, estimated_completion_tokens=400)
    assert accounting.settle(admission, silent).cost == Decimal("0.022000")  # 1000 x 10 + 400 x 30
    # A report larger than the estimates wins.
    admission = accounting.reserve("u1", "d1", "glm-4", 1000, 500)
    loud = Usage("u1", "d1", "glm-4", 2000, 600, estimated_completion_tokens=400)
    assert accounting.settle(admission, loud).cost == Decimal("0.038000")
    with services.db.session() as session:
        records = list(session.scalars(select(UsageRecord).order_by(UsageRecord.id)))
        spent = session.scalars(select(BudgetPeriod.spent)).one()
    assert [(r.model, r.prompt_tokens, r.completion_tokens) for r in records] == [
        ("glm-4", 1000, 400), ("glm-4", 2000, 600)]
    assert spent == Decimal("0.060000")


def test_audit_events_share_the_group_commit_with_settles_and_alerts(services, accounting):
    """Reply events written by the accounting writer land in the chain beside the batch's alert
    events, every one once, and the chain verifies."""
    from app.audit.chain import Event, EventType

    with services.db.transaction() as session:
        set_budget(session, "global", "", "day", "0.2", action="warn", thresholds="50,100")
    barrier = threading.Barrier(16)

    def one(i):
        barrier.wait()
        if i % 2:
            accounting.record_audit(Event(EventType.REPLY_SENT, actor=f"u{i}", outcome="sent",
                                          payload={"message_id": i}))
        else:
            accounting.settle(accounting.reserve(f"u{i}", "", "glm-4", 1000, 500),
                              usage(user=f"u{i}", dept=""))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(16)))
    with services.db.session() as session:
        events = list(session.scalars(select(AuditEvent).order_by(AuditEvent.seq)))
        report = services.audit.verify(session)
    assert report.ok, report.issues
    sent = sorted(services.audit.payload_of(e)["message_id"] for e in events if e.event_type == "reply_sent")
    assert sent == list(range(1, 16, 2))
    assert sorted(e.outcome for e in events if e.event_type == "budget_alert") == ["100%", "50%"]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


def test_record_audit_needs_an_audit_log(services):
    from app.audit.chain import Event, EventType

    with pytest.raises(RuntimeError, match="without an AuditLog"):
        Accounting(services.db, TZ).record_audit(Event(EventType.REPLY_SENT, actor="u1"))


def test_an_admission_made_without_budgets_settles_without_charging_one(services, accounting):
    """The worker admits a call without reserving when its claim read that no budget was
    enabled; one enabled before the settle is charged from the next call, and usage is
    recorded either way."""
    from app.accounting import Admission

    with services.db.transaction() as session:
        set_budget(session, "global", "", "day", "100")
    unbudgeted = Admission(True, user_hash="u1", department="d1", model="glm-4", message_id=1,
                           prompt_tokens=1000, budgeted=False)
    accounting.settle(unbudgeted, usage())
    with services.db.session() as session:
        assert session.scalar(select(func.count()).select_from(BudgetPeriod)) == 0
        assert session.scalar(select(func.count()).select_from(UsageRecord)) == 1
    # In one batch with a budgeted call (the writer's transaction): only that one is charged.
    from app.accounting.batch import SettleArgs
    from app.accounting.group_commit import Job
    now = datetime.now(TZ)
    jobs = [Job("settle", SettleArgs(None, usage(), "glm-4", 1000, 0, 500, now, budgeted))
            for budgeted in (False, True)]
    accounting.write_batch(jobs)
    assert [job.error for job in jobs] == [None, None]
    with services.db.session() as session:
        assert session.scalars(select(BudgetPeriod)).one().spent == Decimal("0.025000")
        assert session.scalar(select(func.count()).select_from(UsageRecord)) == 3


def test_the_writer_copies_the_audit_head_out_after_a_batch_of_audit_events(services, accounting,
                                                                               tmp_path):
    """With AUDIT_HEAD_FILE, the reply events' head reaches the copy (once a batch, written by
    the writer after its callers returned), and verify finds the copy current."""
    import time

    from app.audit.chain import Event, EventType
    from app.audit.head import HeadFile

    services.audit.head_file = HeadFile(tmp_path / "audit-head.json")
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: accounting.record_audit(Event(EventType.REPLY_SENT, actor=f"u{i}")),
                      range(8)))
    deadline = time.monotonic() + 5
    while (copy := services.audit.head_file.read()) is None or copy.last_seq < 8:
        assert time.monotonic() < deadline, copy
        time.sleep(0.02)
    with services.db.session() as session:
        assert services.audit.verify(session).ok


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # SQLite has no server
def test_the_writers_connection_closed_by_the_server_while_held_is_replaced(services, accounting):
    """The writer keeps its connection between batches (given back after ``IDLE_S`` without
    calls); one the server closed meanwhile (a restart, an idle timeout) is checked and replaced
    before the next batch, so no call fails for it."""
    import sqlalchemy as sa

    from tests.app.test_pg_liveness import _terminate

    accounting.settle(None, usage())
    held = accounting.writer_connection
    assert held is not None and not held.closed  # kept after the batch, not given back
    _terminate(held.connection.dbapi_connection.info.backend_pid)
    accounting.settle(None, usage(user="u2"))  # raised "connection lost" before the check
    assert accounting.writer_connection is not held
    with services.db.session() as session:
        assert session.scalar(select(func.count()).select_from(UsageRecord)) == 2
        assert session.scalar(sa.text("SELECT count(*) FROM usage_daily")) == 2


def test_one_batch_writes_its_usage_rows_and_sums_its_rollups_per_key(services, accounting):
    """A batch's usage rows go in as one statement and its rollups as one upsert, one row per
    key: two calls of one user are summed, a second user's is its own row, a later batch adds."""
    from app.accounting.batch import SettleArgs
    from app.accounting.group_commit import Job

    now = datetime.now(TZ)

    def batch(*users):
        jobs = [Job("settle", SettleArgs(None, usage(user=u), "glm-4", 1000, 0, 500, now, False))
                for u in users]
        accounting.write_batch(jobs)
        assert [job.error for job in jobs] == [None] * len(users)

    batch("u1", "u2", "u1")
    batch("u1")
    with services.db.session() as session:
        records = session.scalars(select(UsageRecord).order_by(UsageRecord.id)).all()
        daily = {d.user_hash: d for d in session.scalars(select(UsageDaily))}
    assert [r.user_hash for r in records] == ["u1", "u2", "u1", "u1"]
    assert {r.cost for r in records} == {Decimal("0.025000")}
    assert records[0].created_at == now and records[0].day == now.date()
    assert (daily["u1"].calls, daily["u1"].prompt_tokens, daily["u1"].cost) == (3, 3000, Decimal("0.075000"))
    assert (daily["u2"].calls, daily["u2"].completion_tokens) == (1, 500)


def test_the_cli_takes_a_department_budget_by_its_wecom_id(services, monkeypatch):
    from click.testing import CliRunner

    from app import cli
    from app.models import Budget

    monkeypatch.setattr(cli, "_services", lambda: services)
    runner = CliRunner()
    for value in ("9" * 30, "rd", "7\x00"):
        out = runner.invoke(cli.cli, ["budgets", "set", "department", value, "--limit", "10"])
        assert out.exit_code == 2 and "department id" in out.output, out.output
    assert runner.invoke(cli.cli, ["budgets", "set", "department", "07", "--limit", "10"]).exit_code == 0
    with services.db.session() as session:
        assert [b.scope_value for b in session.query(Budget)] == ["7"]
