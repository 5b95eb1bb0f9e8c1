"""For the fault tests (marker ``faults``): the real stack (tests/support/stack.py) with its parts
killed, restarted or lied to. A plugin: tests/conftest.py registers its ``redis_server`` fixture;
the helpers and DB numbers are imported.

Each module starts its own stack, so a killed worker or a restarted server never leaks into
another test. Redis DB indices 2 (``KILL_DB``) and 3 (``WECOM_DB``) on the shared server belong to
the fault tests; the servers a test restarts are private ones (tests/support/servers.py).
"""

import pytest

from tests.support.servers import PrivateRedis
from tests.support.stack import wait_for

KILL_DB = 2
WECOM_DB = 3


@pytest.fixture(scope="module")
def redis_server():
    """A module's own redis-server: its tests time retries to the second or restart Redis, and
    a shared DB index would let a concurrent run's stack take this one's tasks."""
    server = PrivateRedis().start()
    yield server
    server.close()


def wait_answered(stack, expected: dict[str, list[str]], timeout: float = 120.0) -> None:
    """Wait until every user has at least as many replies as the texts expected of them."""
    wait_for(lambda: all(len(stack.replies(u)) >= len(texts) for u, texts in expected.items()),
             timeout=timeout, interval=0.5, what="every message answered")


def answered_once(stack, expected: dict[str, list[str]]) -> dict[str, list[str]]:
    """Per user, what is wrong: texts answered zero or several times, or unexpected replies."""
    problems = {}
    for user, texts in expected.items():
        replies = stack.replies(user)
        counts = {text: sum(1 for r in replies if r.endswith(f": {text}")) for text in texts}
        wrong = [f"{text!r} x{n}" for text, n in counts.items() if n != 1]
        if wrong or len(replies) != len(texts):
            problems[user] = wrong or replies
    return problems
