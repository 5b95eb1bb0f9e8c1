"""A RabbitMQ vhost of a test run's own on the machine's broker (127.0.0.1:5672, guest/guest):
its queues never meet another run's, and it is deleted afterwards."""

from __future__ import annotations

import contextlib
import subprocess
import uuid


def rabbitmqctl(*args: str) -> str:
    return subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True, check=True,
                          timeout=120).stdout


@contextlib.contextmanager
def rabbitmq_vhost():
    """Yields the broker URL of a fresh vhost."""
    name = f"wecom_test_{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", name)
    try:
        rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield f"amqp://guest:guest@127.0.0.1:5672/{name}"
    finally:
        rabbitmqctl("delete_vhost", name)
