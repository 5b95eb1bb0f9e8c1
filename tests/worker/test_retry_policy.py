"""worker/retry_policy.py: WeCom's frequency limit waits for its window, everything else backs
off quickly, and no wait outlives the broker's visibility timeout."""

from __future__ import annotations

import random

import pytest

from tests.support.env import make_env, settings_from
from worker import retry_policy
from worker.celery_app import make_celery


class Fixed(random.Random):
    def __init__(self, value: float):
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


def test_rate_limit_waits_for_the_minute_window_then_doubles_up_to_the_cap():
    waits = [retry_policy.countdown(n, rate_limited=True, rng=Fixed(0.0)) for n in range(1, 7)]
    assert waits == [60, 120, 240, 300, 300, 300]


def test_rate_limit_jitter_is_at_most_ten_percent_and_never_past_the_cap():
    low = retry_policy.countdown(1, rate_limited=True, rng=Fixed(0.0))
    high = retry_policy.countdown(1, rate_limited=True, rng=Fixed(0.999))
    assert low == 60 and 60 < high < 66
    assert retry_policy.countdown(4, rate_limited=True, rng=Fixed(0.999)) == 300


def test_the_default_schedule_of_five_attempts_fits_wecoms_duplicate_check_window():
    settings = settings_from(make_env())
    total = sum(retry_policy.countdown(n, rate_limited=True, rng=Fixed(0.999),
                                       rate_limit_base_s=settings.wecom_rate_limit_retry_s)
                for n in range(1, settings.task_max_retries))
    assert total < settings.wecom_duplicate_check_s


def test_other_transient_failures_back_off_quickly():
    assert [retry_policy.countdown(n) for n in range(1, 8)] == [2, 4, 8, 16, 32, 60, 60]


@pytest.mark.parametrize(("rate_limited", "attempt", "expected"), [(True, 1, 90), (False, 1, 90),
                                                                   (False, 1, 10_000)])
def test_a_wait_the_server_asked_for_is_honoured_up_to_the_cap(rate_limited, attempt, expected):
    wait = retry_policy.countdown(attempt, rate_limited=rate_limited, retry_after=expected,
                                  rng=Fixed(0.0))
    assert wait == min(expected, retry_policy.MAX_WAIT_S)


def test_no_wait_outlives_the_brokers_visibility_timeout():
    app = make_celery(settings_from(make_env()))
    assert app.conf.broker_transport_options["visibility_timeout"] > retry_policy.MAX_WAIT_S
