import pytest

from tests.support.stack import Stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory):
    """The running stack, once per module and database kind."""
    s = Stack(tmp_path_factory.mktemp(f"stack-{request.param}"), db_kind=request.param).start()
    yield s
    s.stop()
