import pytest

from tests.support.rabbitmq import rabbitmq_vhost
from tests.support.stack import Stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def broker_env(request):
    """`--broker rabbitmq`: the stacks' Celery runs on RabbitMQ, in a vhost of this run's."""
    if request.config.getoption("--broker") != "rabbitmq":
        yield {}
        return
    with rabbitmq_vhost() as url:
        yield {"CELERY_BROKER_URL": url}


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory, broker_env):
    """The running stack, once per module and database kind."""
    s = Stack(tmp_path_factory.mktemp(f"stack-{request.param}"), db_kind=request.param,
              extra_env=broker_env).start()
    yield s
    s.stop()
