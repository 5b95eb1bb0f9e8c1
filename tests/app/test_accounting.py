"""Pure accounting logic: periods in the company time zone, costs, thresholds, settings."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest

from app.accounting import (
    cost_of,
    estimate_completion_tokens,
    estimate_prompt_tokens,
    period_end,
    period_start,
    worst_case,
)
from app.config import ConfigError
from app.db import Money, to_money
from tests.support.env import make_env, settings_from

SH = ZoneInfo("Asia/Shanghai")


def utc(*args):
    return datetime(*args, tzinfo=UTC)


def test_day_rolls_over_at_local_midnight():
    # 2026-03-04 15:59 UTC is 23:59 in Shanghai; a minute later it is the next day there.
    assert period_start("day", utc(2026, 3, 4, 15, 59), SH) == utc(2026, 3, 3, 16, 0)
    assert period_start("day", utc(2026, 3, 4, 16, 0), SH) == utc(2026, 3, 4, 16, 0)
    assert period_end("day", utc(2026, 3, 3, 16, 0), SH) == utc(2026, 3, 4, 16, 0)


def test_week_starts_monday_local():
    # Sunday 2026-03-08 23:30 Shanghai (15:30 UTC) is still the week of Monday 03-02.
    assert period_start("week", utc(2026, 3, 8, 15, 30), SH) == utc(2026, 3, 1, 16, 0)
    # Monday 00:10 Shanghai starts a new week.
    assert period_start("week", utc(2026, 3, 8, 16, 10), SH) == utc(2026, 3, 8, 16, 0)
    assert period_end("week", utc(2026, 3, 1, 16, 0), SH) == utc(2026, 3, 8, 16, 0)


def test_month_starts_on_the_first_local():
    assert period_start("month", utc(2026, 2, 28, 15, 59), SH) == utc(2026, 1, 31, 16, 0)
    assert period_start("month", utc(2026, 2, 28, 16, 0), SH) == utc(2026, 2, 28, 16, 0)
    assert period_end("month", utc(2026, 11, 30, 16, 0), SH) == utc(2026, 12, 31, 16, 0)


def test_unknown_period():
    with pytest.raises(ValueError):
        period_start("year", utc(2026, 1, 1), SH)


def test_costs_are_exact_decimals():
    price = SimpleNamespace(input_per_m=Decimal("4"), cached_input_per_m=Decimal("1"),
                            output_per_m=Decimal("16"))
    assert cost_of(price, 1000, 200, 300) == Decimal("0.008200")
    assert cost_of(price, 10, 50, 0) == Decimal("0.000010")  # cached never exceeds the prompt
    assert worst_case(price, 1000, 512) == Decimal("0.012192")
    assert cost_of(None, 1000, 0, 1000) == 0


HARD_TEXTS = ["😀🎉👍🏽🧑‍💻" * 20, "𠀀𠀁𪚥𰻞" * 30, "你好，请问报销流程？", "plain ascii, words and 123"]


def test_prompt_estimate_is_an_upper_bound_in_utf8_bytes():
    # A token of a byte-level tokenizer covers at least one byte: the bytes bound it, whatever
    # the characters (emoji, rare CJK), plus each message's template tokens.
    assert estimate_prompt_tokens([{"role": "user", "content": "你好"}, {"content": None}]) >= 6 + 2
    for text in HARD_TEXTS:
        assert estimate_prompt_tokens([{"role": "user", "content": text}]) > len(text.encode())


@pytest.mark.parametrize("text", HARD_TEXTS)
def test_prompt_estimate_bounds_the_real_tokenizer(text):
    from inference.tokenizer import ChatTokenizer

    tokenizer = ChatTokenizer.from_pretrained(Path(__file__).parents[2] / "models" / "demo")
    messages = [{"role": "system", "content": "你是公司助手。"}, {"role": "user", "content": text},
                {"role": "assistant", "content": text}, {"role": "user", "content": text + "?"}]
    assert estimate_prompt_tokens(messages) >= len(tokenizer.apply_chat_template(messages))
    assert estimate_completion_tokens(text) >= len(tokenizer.encode(text))


def test_money_round_trips_millionths():
    money = Money()
    assert money.process_bind_param(Decimal("1.2345675"), None) == 1234568
    assert money.process_result_value(1234568, None) == Decimal("1.234568")
    assert to_money("0.1") + to_money("0.2") == Decimal("0.300000")


@pytest.mark.parametrize(("name", "value", "message"), [
    ("AUDIT_RETENTION_DAYS", "179", "AUDIT_RETENTION_DAYS must be at least 180"),
    ("COMPANY_TIMEZONE", "Mars/Olympus", "COMPANY_TIMEZONE unknown time zone"),
    ("BUDGET_THRESHOLDS", "50,eighty", "BUDGET_THRESHOLDS thresholds must be whole"),
    ("ALERT_WEBHOOK_URL", "ftp://x", r"ALERT_WEBHOOK_URL must be an http\(s\) URL"),
    ("CURRENCY", "RMB1", "CURRENCY must be a 3-letter"),
])
def test_data_settings_are_validated(name, value, message):
    with pytest.raises(ConfigError, match=message):
        settings_from(make_env(**{name: value}))


def test_data_settings_defaults_and_lists():
    settings = settings_from(make_env(ALERT_WECOM_USERS="zhangsan, lisi|wangwu"))
    assert settings.audit_retention_days == 180
    assert settings.timezone == SH and settings.thresholds == (50, 80, 100)
    assert settings.alert_recipients == ["zhangsan", "lisi", "wangwu"]
