"""The kf channel's token budget reads what the channel used this period from the usage rollup."""

from datetime import datetime, timedelta

from app.models import UsageDaily
from worker.kf.budget import KF_DEPARTMENT, KfBudget

USER = "h" * 64


def add_usage(services, department: str, prompt_tokens: int, day) -> None:
    with services.db.transaction() as session:
        session.add(UsageDaily(day=day, department=department, user_hash=USER, model="m", calls=1,
                               prompt_tokens=prompt_tokens, completion_tokens=prompt_tokens // 2,
                               cached_tokens=0, cost=0))


def test_only_the_channels_tokens_of_this_period_count(services, monkeypatch):
    budget = KfBudget(services)
    monkeypatch.setattr(services.settings, "kf_budget_tokens", 1000)
    monkeypatch.setattr(services.settings, "kf_budget_period", "day")
    today = datetime.now(services.settings.timezone).date()  # the company's day
    add_usage(services, "7", 5000, today)  # an employee department's spend is not the channel's
    add_usage(services, KF_DEPARTMENT, 5000, today - timedelta(days=1))  # yesterday's
    assert budget.used() == 0 and not budget.spent()
    add_usage(services, KF_DEPARTMENT, 600, today)
    assert budget.used() == 900 and not budget.spent()
    with services.db.transaction() as session:
        session.get(UsageDaily, (today, KF_DEPARTMENT, USER, "m")).prompt_tokens += 100
    assert budget.used() == 1000 and budget.spent()
    monkeypatch.setattr(services.settings, "kf_budget_tokens", 0)
    assert not budget.spent()  # 0: no budget
