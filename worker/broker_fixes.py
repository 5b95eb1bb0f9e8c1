"""Keep the Celery worker alive when its Redis broker goes away (a Redis restart).

Celery 5.7 / kombu 5.7 end the worker with ``Unrecoverable error: AttributeError("'NoneType'
object has no attribute 'hostname'")`` when the broker connection drops while the worker holds
unacknowledged tasks (``acks_late`` + prefetch: it always does). The sequence, read in the
installed sources:

1. ``Consumer.on_connection_error_after_connected`` first calls ``connection.collect()``. For the
   Redis transport that closes the default channel, but ``Channel.close()`` begins by reading the
   pending ``BRPOP`` reply (``_brpop_read``), which raises ``ConnectionError`` on the dead socket
   *before* the channel is marked closed; the error is swallowed (``maybe_close_channel``) and
   ``collect()`` then detaches the transport from its ``Connection`` (``transport.client = None``).
2. It then calls ``connection.close()``, which closes the same, still-open channel again. This
   time ``close()`` gets as far as restoring the unacknowledged messages, which builds a new
   Redis pool from ``Channel._connparams()`` - and that reads ``self.connection.client.hostname``
   on the detached transport: ``AttributeError``.
3. ``AttributeError`` is neither a connection nor a channel error, so it escapes every cleanup
   guard (``ignore_errors``, ``maybe_close_channel``) and the consumer's reconnect handler, and
   ``WorkController.start`` logs it as unrecoverable and stops the process.

The same read fails later for an ``acks_late`` task that finishes after the reconnect: its ack
goes to the old channel, whose transport is gone (``channel.connection is None``).

The fix is one guard: a channel whose transport or connection is gone raises the Redis
``ConnectionError`` that all of these paths already expect and tolerate (the reconnect goes on,
a late ack is logged as "Couldn't ack"). Nothing is lost by not restoring or acking through a
dead connection: Redis restores unacknowledged messages after the visibility timeout by itself,
the outbox sweeper re-publishes rows whose task was lost, and the task is idempotent (row lease
and status), so a redelivered message is never answered twice. The guard changes nothing while
the channel is attached. ``tests/worker/test_server_restarts.py`` (Redis restarted while
messages arrive: the worker keeps its pid and answers every one) proves the worker now
reconnects in-process.
"""

from __future__ import annotations

import functools

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

_MARK = "_wecom_bot_detached_guard"


def apply() -> None:
    """Install the guard on kombu's Redis channel (idempotent)."""
    channel_cls = kombu_redis.Channel
    original = channel_cls._connparams
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def _connparams(self, asynchronous=False):
        transport = self.connection
        if transport is None or transport.client is None:
            raise RedisConnectionError(
                "kombu redis channel used after its broker connection was closed")
        return original(self, asynchronous=asynchronous)

    setattr(_connparams, _MARK, True)
    channel_cls._connparams = _connparams
