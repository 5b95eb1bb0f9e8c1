"""Suite-wide hooks, options, and the fixture plugins that several folders use (tests/README.md)."""

import pytest

from tests.support.stack import LIVE_STACKS

pytest_plugins = [
    "tests.support.databases",  # database_url, env, settings, db, redis_client, services
    "tests.support.stacks",  # stack, broker_env, redis_env (--broker, --redis)
    "tests.support.faults",  # redis_server
    "tests.support.browser",  # site, browser, page
]


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
                     help="the Celery broker of integration tests' stacks (the ``stack`` fixture): "
                          "redis (default) or rabbitmq (the machine's RabbitMQ, a vhost per run)")
    parser.addoption("--redis", choices=("single", "cluster", "sentinel"), default="single",
                     help="the Redis of integration tests' stacks (the ``stack`` fixture): single "
                          "(default: the machine's redis-server), cluster (a Redis Cluster of six "
                          "redis-server processes the run starts, tests/support/redis_cluster.py; Celery "
                          "then runs on RabbitMQ with --broker rabbitmq, else on the machine's Redis) or "
                          "sentinel (a primary, a replica and three Sentinels the run starts, "
                          "tests/support/redis_sentinel.py; Celery on it too unless --broker rabbitmq)")
