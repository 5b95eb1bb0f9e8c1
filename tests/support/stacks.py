"""The integration tests' stack fixtures (a plugin: tests/conftest.py registers it): ``stack``,
the running stack once per session and database kind, on the Celery broker and Redis topology
that ``--broker`` and ``--redis`` choose (``broker_env``, ``redis_env``)."""

import pytest

from tests.support.env import redis_url
from tests.support.rabbitmq import rabbitmq_vhost
from tests.support.redis_cluster import LocalRedisCluster
from tests.support.redis_sentinel import LocalRedisSentinel
from tests.support.stack import Stack


@pytest.fixture(scope="session")
def broker_env(request):
    """`--broker rabbitmq`: the stacks' Celery runs on RabbitMQ, in a vhost of this run's."""
    if request.config.getoption("--broker") != "rabbitmq":
        yield {}
        return
    with rabbitmq_vhost() as url:
        yield {"CELERY_BROKER_URL": url}


@pytest.fixture(scope="session")
def redis_env(request, broker_env):
    """`--redis cluster`: the stacks' state on a Redis Cluster of this run's own (six
    redis-server processes, stopped after the session). A cluster cannot be Celery's broker:
    Celery runs on RabbitMQ with `--broker rabbitmq`, else on the machine's plain Redis.
    `--redis sentinel`: state (DB 0) and, without `--broker rabbitmq`, Celery's broker (DB 1)
    on a Sentinel-watched primary of this run's own."""
    topology = request.config.getoption("--redis")
    if topology == "single":
        yield {}
        return
    if topology == "cluster":
        servers = LocalRedisCluster().start()
        env = {"REDIS_URL": servers.url, "CELERY_BROKER_URL": redis_url(9)}
    else:
        servers = LocalRedisSentinel().start()
        env = {"REDIS_URL": servers.url(0), "CELERY_BROKER_URL": servers.url(1)}
    try:
        yield {**env, **broker_env}  # --broker rabbitmq: its vhost is the broker
    finally:
        servers.close()


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory, broker_env, redis_env):
    """The running stack, once per module and database kind."""
    s = Stack(tmp_path_factory.mktemp(f"stack-{request.param}"), db_kind=request.param,
              redis_url=redis_env.get("REDIS_URL"), extra_env={**broker_env, **redis_env}).start()
    yield s
    s.stop()
