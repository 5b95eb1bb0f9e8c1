"""Suite-wide hooks."""

import pytest

from tests.support.stack import LIVE_STACKS


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that fails while stacks run carries their processes' last log lines."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when in ("setup", "call"):
        for stack in list(LIVE_STACKS):
            for title, text in stack.log_tails():
                report.sections.append((f"stack log: {title}", text))


def pytest_addoption(parser):
    parser.addoption("--broker", choices=("redis", "rabbitmq"), default="redis",
                     help="the Celery broker of the integration suite's stacks (tests/integration): "
                          "redis (default) or rabbitmq (the machine's RabbitMQ, a vhost per run)")
    parser.addoption("--redis", choices=("single", "cluster", "sentinel"), default="single",
                     help="the Redis of the integration suite's stacks (tests/integration): single "
                          "(default: the machine's redis-server), cluster (a Redis Cluster of six "
                          "redis-server processes the run starts, tests/support/redis_cluster.py; Celery "
                          "then runs on RabbitMQ with --broker rabbitmq, else on the machine's Redis) or "
                          "sentinel (a primary, a replica and three Sentinels the run starts, "
                          "tests/support/redis_sentinel.py; Celery on it too unless --broker rabbitmq)")
