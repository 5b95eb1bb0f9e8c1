"""What the dashboard and the finance export read: the ``usage_daily`` rollups, budgets, alerts.

All queries are aggregates over the rollup table (one row per day x department x user x model),
never over ``usage_records``, so a month of a large company stays a few thousand rows. Days are
company-local (``COMPANY_TIMEZONE``), as the rollups store them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.accounting import parse_thresholds, period_start
from app.db import utcnow
from app.models import Budget, BudgetAlert, BudgetPeriod, InboundMessage, UsageDaily
from app.web.admin.limits import DATE_RANGE_MESSAGE, day_in_range
from app.wecom.departments import DepartmentIdError, department_filter

MAX_RANGE_DAYS = 366


@dataclass(frozen=True)
class Filters:
    since: date
    until: date
    department: str | None = None

    @property
    def days(self) -> list[date]:
        return [self.since + timedelta(days=i) for i in range((self.until - self.since).days + 1)]

    def as_args(self) -> dict:
        args = {"since": self.since.isoformat(), "until": self.until.isoformat()}
        if self.department:
            args["department"] = self.department
        return args


def parse_filters(args, tz: ZoneInfo, today: date | None = None) -> Filters:
    """``since``/``until`` (ISO dates, default the last 30 days) and ``department``.

    Raises ``ValueError`` with a message for the page on a malformed or too long range.
    """
    today = today or utcnow().astimezone(tz).date()
    try:
        until = date.fromisoformat(args.get("until") or today.isoformat())
        since = date.fromisoformat(args.get("since") or (until - timedelta(days=29)).isoformat())
    except ValueError:
        raise ValueError("dates must look like 2026-12-01") from None
    except OverflowError:  # a default start 29 days before 0001-01-01
        raise ValueError(DATE_RANGE_MESSAGE) from None
    if not (day_in_range(since) and day_in_range(until)):
        raise ValueError(DATE_RANGE_MESSAGE)
    if since > until:
        raise ValueError("the start date is after the end date")
    if (until - since).days >= MAX_RANGE_DAYS:
        raise ValueError(f"at most {MAX_RANGE_DAYS} days at a time")
    try:  # a department id or nothing: a 30-digit number or a NUL byte never reaches the query
        department = department_filter(args.get("department"))
    except DepartmentIdError as exc:
        raise ValueError(f"department: {exc}") from None
    return Filters(since, until, department)


def _where(filters: Filters):
    conditions = [UsageDaily.day >= filters.since, UsageDaily.day <= filters.until]
    if filters.department is not None:
        conditions.append(UsageDaily.department == filters.department)
    return conditions


def _grouped(session: Session, filters: Filters, *columns, order_by_cost=True, limit=None):
    cost = func.sum(UsageDaily.cost).label("cost")
    query = (select(*columns, cost, func.sum(UsageDaily.calls).label("calls"),
                    func.sum(UsageDaily.prompt_tokens + UsageDaily.completion_tokens).label("tokens"))
             .where(*_where(filters)).group_by(*columns))
    query = query.order_by(cost.desc(), *columns) if order_by_cost else query.order_by(*columns)
    if limit:
        query = query.limit(limit)
    return [dict(row._mapping) for row in session.execute(query)]


def _money(value) -> Decimal:
    # SUM keeps the column's type (Money), so it is a Decimal already; None when no rows.
    return value if value is not None else Decimal(0)


def spend(session: Session, filters: Filters) -> dict:
    """Totals, spend per day, department, model, top users (blind index), for the filters."""
    by_day = {row["day"]: row for row in _grouped(session, filters, UsageDaily.day,
                                                   order_by_cost=False)}
    out = {
        "days": [d.isoformat() for d in filters.days],
        "daily_cost": [_money(by_day[d]["cost"]) if d in by_day else Decimal(0) for d in filters.days],
        "daily_calls": [int(by_day[d]["calls"]) if d in by_day else 0 for d in filters.days],
        "departments": _grouped(session, filters, UsageDaily.department),
        "models": _grouped(session, filters, UsageDaily.model),
        "top_users": _grouped(session, filters, UsageDaily.user_hash, limit=10),
    }
    for group in ("departments", "models", "top_users"):
        for row in out[group]:
            row["cost"] = _money(row["cost"])
    out["total_cost"] = sum(out["daily_cost"], Decimal(0))
    out["total_calls"] = sum(out["daily_calls"])
    return out


def departments(session: Session) -> list[str]:
    return list(session.scalars(select(UsageDaily.department).distinct()
                                .order_by(UsageDaily.department)))


def budget_utilisation(session: Session, tz: ZoneInfo, department: str | None = None,
                       now: datetime | None = None) -> list[dict]:
    """Each enabled budget's spend in its current period, as a share of the limit."""
    now = now or utcnow()
    query = select(Budget).where(Budget.enabled.is_(True)).order_by(Budget.scope, Budget.id)
    out = []
    for budget in session.scalars(query):
        if department and budget.scope == "department" and budget.scope_value != department:
            continue
        start = period_start(budget.period, now, tz)
        row = session.get(BudgetPeriod, (budget.id, start))
        spent = row.spent if row else Decimal(0)
        percent = float(spent * 100 / budget.limit) if budget.limit else 0.0
        thresholds = parse_thresholds(budget.thresholds)
        out.append({"budget": budget, "period_start": start, "spent": spent,
                    "reserved": row.reserved if row else Decimal(0), "percent": percent,
                    "thresholds": thresholds,
                    "reached": [t for t in thresholds if percent >= t]})
    return out


def recent_alerts(session: Session, limit: int = 20) -> list[tuple[BudgetAlert, Budget]]:
    return list(session.execute(select(BudgetAlert, Budget).join(Budget, Budget.id == BudgetAlert.budget_id)
                                .order_by(BudgetAlert.created_at.desc()).limit(limit)).all())


def _received_within(filters: Filters, tz: ZoneInfo) -> tuple:
    start = datetime(filters.since.year, filters.since.month, filters.since.day, tzinfo=tz)
    end_day = filters.until + timedelta(days=1)
    end = datetime(end_day.year, end_day.month, end_day.day, tzinfo=tz)
    return InboundMessage.created_at >= start, InboundMessage.created_at < end


def message_counts(session: Session, filters: Filters, tz: ZoneInfo) -> dict[str, int]:
    """Inbound messages by status (answered, failed, ...) received within the date range."""
    rows = session.execute(select(InboundMessage.status, func.count())
                           .where(*_received_within(filters, tz))
                           .group_by(InboundMessage.status))
    return {status: int(count) for status, count in rows}


def delivery_failures(session: Session, filters: Filters, tz: ZoneInfo, limit: int = 10) -> dict:
    """Why answers did not arrive: failed messages by reason, the latest ones, and those retrying.

    The reasons are the processor's short codes (``wecom: HTTP 503 ...``, ``gave up after 5
    attempts: ...``), never message text, so an admin may see them.
    """
    within = _received_within(filters, tz)
    failed = (*within, InboundMessage.status == "failed")
    count = func.count().label("n")
    by_reason = session.execute(
        select(InboundMessage.failure_reason, count).where(*failed)
        .group_by(InboundMessage.failure_reason).order_by(count.desc()).limit(limit))
    latest = session.execute(
        select(InboundMessage.id, InboundMessage.created_at, InboundMessage.attempts,
               InboundMessage.failure_reason)
        .where(*failed).order_by(InboundMessage.id.desc()).limit(limit))
    retrying = session.scalar(
        select(func.count()).select_from(InboundMessage)
        .where(*within, InboundMessage.status.in_(("queued", "processing")),
               InboundMessage.failure_reason.is_not(None)))
    return {
        "by_reason": [{"reason": reason or "(none)", "count": int(n)} for reason, n in by_reason],
        "latest": [{"id": row.id, "created_at": row.created_at.astimezone(tz), "attempts": row.attempts,
                    "reason": row.failure_reason or "(none)"} for row in latest],
        "retrying": int(retrying or 0),
    }


# -- finance export ----------------------------------------------------------------------------------
FINANCE_COLUMNS = ("period", "department", "user", "model", "calls", "prompt_tokens",
                   "cached_tokens", "completion_tokens", "cost", "currency",
                   "accounting_subject", "invoice_item")


def finance_rows(session: Session, filters: Filters, granularity: str) -> Iterator[tuple]:
    """Cost per period (day or month) x department x user (blind index) x model."""
    if granularity not in ("day", "month"):
        raise ValueError("granularity must be day or month")
    query = (select(UsageDaily.day, UsageDaily.department, UsageDaily.user_hash, UsageDaily.model,
                    UsageDaily.calls, UsageDaily.prompt_tokens, UsageDaily.cached_tokens,
                    UsageDaily.completion_tokens, UsageDaily.cost)
             .where(*_where(filters))
             .order_by(UsageDaily.day, UsageDaily.department, UsageDaily.user_hash, UsageDaily.model)
             .execution_options(yield_per=1000))
    if granularity == "day":
        for row in session.execute(query):
            yield (row.day.isoformat(), *row[1:])
        return
    # Months: sum consecutive day rows per key in Python; the rows arrive ordered by day, so one
    # month is held at a time (bounded by that month's distinct keys).
    month, acc = None, {}
    for row in session.execute(query):
        key_month = row.day.strftime("%Y-%m")
        if key_month != month:
            yield from _flush(month, acc)
            month, acc = key_month, {}
        key = (row.department, row.user_hash, row.model)
        totals = acc.setdefault(key, [0, 0, 0, 0, Decimal(0)])
        for i, value in enumerate((row.calls, row.prompt_tokens, row.cached_tokens,
                                   row.completion_tokens, row.cost)):
            totals[i] += value
    yield from _flush(month, acc)


def _flush(month, acc) -> Iterator[tuple]:
    for key in sorted(acc):
        yield (month, *key, *acc[key])
