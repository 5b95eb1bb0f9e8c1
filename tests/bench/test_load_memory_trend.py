"""bench.load's memory verdict: a leak keeps growing, a pool filling up during warm-up does not."""

from bench.load import memory_trend


def series(rss_at, seconds=360, every=5):
    return [(float(t), rss_at(t)) for t in range(0, seconds + 1, every)]


def test_a_step_while_warming_up_is_not_a_leak():
    # the worker of a 360-s run: flat, one ~9 MiB step between 90 and 165 s, flat again
    def plateau(t):
        return 163 + min(max(t - 90, 0), 75) * 0.12 + t * 0.1 / 60

    trend = memory_trend(series(plateau))
    assert trend["stable"] and abs(trend["slope"] - 0.1) < 0.05 and trend["last"] - trend["first"] > 8


def test_steady_growth_is_a_leak():
    trend = memory_trend(series(lambda t: 160 + t * 2 / 60))  # 2 MiB a minute, all along
    assert not trend["stable"] and abs(trend["slope"] - 2) < 0.05


def test_growth_that_starts_late_is_caught():
    trend = memory_trend(series(lambda t: 160 + max(t - 200, 0) * 3 / 60))
    assert not trend["stable"]
