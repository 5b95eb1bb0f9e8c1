"""One factory for every Redis client of the app and the worker: one server, a Redis Cluster, or
a primary that Redis Sentinel watches, as ``REDIS_URL`` names it.

URL forms (docs/scaling.md, "Redis topologies"):

- ``redis://[user:pass@]host:port/db``, ``rediss://`` (TLS), ``unix://``: one server, as before
  (redis-py's ``Redis.from_url``).
- ``redis+cluster://[user:pass@]host:port[,host:port...][/]``, ``rediss+cluster://``: a Redis
  Cluster; the nodes listed are where discovery starts (any one reachable is enough, list a few).
  A cluster has database 0 only. redis-py's ``RedisCluster`` follows ``MOVED``/``ASK``; this
  module's subclass also waits out a failover (see ``FAILOVER_ERRORS``).
- ``redis+sentinel://[user:pass@]host:port[,host:port...]/service[/db]``, ``rediss+sentinel://``:
  the primary of Sentinel service ``service`` (redis-py's ``Sentinel.master_for``); the user and
  password are the primary's. ``?sentinel_username=&sentinel_password=`` when the Sentinels
  have their own.

Both multi-node forms take ``?failover_wait=SECONDS`` (default 10): how long a command keeps
being retried (with backoff) while its primary is gone and a replica not yet promoted. Set it
above the cluster's ``cluster-node-timeout`` (or Sentinel's ``down-after-milliseconds``) plus the
election: a command that gives up earlier fails like a Redis outage does (rate limits fail
open, a task is retried), one that waits holds its thread that long.

Celery cannot use a cluster as its broker (kombu's Redis transport needs one keyspace for its
queue, its unacked hash and its index); ``celery_broker`` says so at start and turns the Sentinel
form into kombu's ``sentinel://`` transport.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote

import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.crc import key_slot
from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel

log = logging.getLogger(__name__)

CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}  # scheme -> TLS
SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
DEFAULT_FAILOVER_WAIT_S = 10.0
_OPTIONS = {"cluster": {"failover_wait"},
            "sentinel": {"failover_wait", "sentinel_username", "sentinel_password"}}
# What a command meets while a primary is down and before a replica took its slots over: the
# dead node's refused or cut connections, CLUSTERDOWN, a slot no live node serves, TRYAGAIN
# (a multi-key command during a slot migration). redis-py re-reads the slot table after each.
# And ClusterError "TTL exhausted": redis-py's own 16 redirections (ASK, TRYAGAIN) used up by one
# command while a slot with many keys migrates (CI met it once, under load).
FAILOVER_ERRORS = (RedisConnectionError, RedisTimeoutError, ClusterDownError, SlotNotCoveredError,
                   TryAgainError, ClusterError)
_FIRST_DELAY_S, _MAX_DELAY_S = 0.05, 0.5


@dataclass(frozen=True)
class RedisTarget:
    """What a ``REDIS_URL`` names (password included: never log this)."""

    kind: str  # "single", "cluster" or "sentinel"
    url: str
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl: bool = False
    failover_wait_s: float = DEFAULT_FAILOVER_WAIT_S
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)


def kind_of(url: str | None) -> str:
    """"cluster", "sentinel" or "single" by the URL's scheme alone (no validation)."""
    scheme = (url or "").partition("://")[0].lower()
    if scheme in CLUSTER_SCHEMES:
        return "cluster"
    if scheme in SENTINEL_SCHEMES:
        return "sentinel"
    return "single"


def parse(url: str) -> RedisTarget:
    """The target of a Redis URL; ``ValueError`` saying what is wrong with it."""
    kind = kind_of(url)
    if kind == "single":
        return RedisTarget("single", url)
    scheme, _, rest = url.partition("://")
    ssl = {**CLUSTER_SCHEMES, **SENTINEL_SCHEMES}[scheme.lower()]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    path, _, query = tail.partition("?")
    username = password = None
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        user, has_password, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if has_password else None
    default_port = 26379 if kind == "sentinel" else 6379
    nodes = tuple(_host_port(part, default_port) for part in netloc.split(",") if part.strip())
    if not nodes:
        raise ValueError(f"{scheme}:// needs at least one host:port")
    segments = [unquote(s) for s in path.split("/") if s]
    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(options) - _OPTIONS[kind])
    if unknown:
        raise ValueError(f"unknown {scheme}:// option(s) {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(_OPTIONS[kind]))})")
    try:
        wait = float(options.get("failover_wait", DEFAULT_FAILOVER_WAIT_S))
    except ValueError:
        raise ValueError("failover_wait must be a number of seconds") from None
    if not 0 <= wait <= 300:
        raise ValueError("failover_wait must be between 0 and 300 seconds")
    if kind == "cluster":
        if segments not in ([], ["0"]):
            raise ValueError("a Redis Cluster has database 0 only: end the URL with / or /0")
        return RedisTarget("cluster", url, nodes, username=username, password=password, ssl=ssl,
                           failover_wait_s=wait)
    if not segments or len(segments) > 2:
        raise ValueError(f"{scheme}:// needs the Sentinel service name: "
                         f"{scheme}://host:port[,host:port]/SERVICE[/DB]")
    db = 0
    if len(segments) == 2:
        if not segments[1].isdigit():
            raise ValueError(f"the database after the service name must be a number, not {segments[1]!r}")
        db = int(segments[1])
    return RedisTarget("sentinel", url, nodes, service=segments[0], db=db, username=username,
                       password=password, ssl=ssl, failover_wait_s=wait,
                       sentinel_username=options.get("sentinel_username") or None,
                       sentinel_password=options.get("sentinel_password") or None)


def _host_port(text: str, default_port: int) -> tuple[str, int]:
    text = text.strip()
    if text.startswith("["):  # [IPv6]:port
        host, _, after = text[1:].partition("]")
        port = after.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    if not host:
        raise ValueError(f"no host in {text!r}")
    if port and not port.isdigit():
        raise ValueError(f"bad port in {text!r}")
    return host, int(port) if port else default_port


def from_url(url: str, *, socket_timeout: float = 2.0, socket_connect_timeout: float = 1.0,
             **kwargs):
    """The client for ``url``: ``redis.Redis`` (one server, or Sentinel's current primary) or
    ``RedisCluster``. Each has the same commands for the single-key use this app makes."""
    target = parse(url)
    timeouts = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_connect_timeout}
    if target.kind == "single":
        return redis.Redis.from_url(url, **timeouts, **kwargs)
    auth = {"username": target.username, "password": target.password}
    if target.kind == "cluster":
        client = FailoverRedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.nodes], ssl=target.ssl,
            # redis-py retries at once (no backoff) and re-reads the slot table in between; the
            # waiting is FailoverRedisCluster's, so a few immediate tries are enough here.
            retry=Retry(NoBackoff(), 2), **auth, **timeouts, **kwargs)
        client.failover_wait_s = target.failover_wait_s
        return client
    # A Sentinel that does not answer is skipped for the next one (redis-py asks each in turn):
    # no retries of its own, which would hold every lookup of the primary on a dead Sentinel.
    sentinel_kwargs = {**timeouts, "username": target.sentinel_username,
                       "password": target.sentinel_password, "ssl": target.ssl,
                       "retry": Retry(NoBackoff(), 0)}
    sentinel = Sentinel(list(target.nodes), sentinel_kwargs=sentinel_kwargs, **timeouts)
    # A standalone client's retries do back off: enough of them to cover failover_wait (each try
    # also asks the Sentinels where the primary is now).
    retries = max(1, math.ceil(target.failover_wait_s / _MAX_DELAY_S))
    retry = Retry(ExponentialWithJitterBackoff(base=_FIRST_DELAY_S, cap=_MAX_DELAY_S), retries)
    return sentinel.master_for(target.service, db=target.db, ssl=target.ssl, retry=retry,
                               **auth, **timeouts, **kwargs)


def _ride_out(wait_s: float, call):
    """``call()``, tried again with backoff for up to ``wait_s`` while it meets a failover."""
    deadline = time.monotonic() + wait_s
    delay = _FIRST_DELAY_S
    while True:
        try:
            return call()
        except FAILOVER_ERRORS as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.debug("redis cluster: %s, trying again in %.2f s", type(exc).__name__, delay)
            time.sleep(delay)
            delay = min(delay * 2, _MAX_DELAY_S)


class FailoverRedisCluster(RedisCluster):
    """``RedisCluster`` that keeps trying a command while a primary fails over.

    redis-py follows ``MOVED``/``ASK`` and, on a connection error, re-reads the slot table and
    tries again at once; until a replica is promoted the table still names the dead primary, so
    those tries all fail within milliseconds. This retries the whole command with backoff for
    ``failover_wait_s`` (the same for pipelines, whose commands are staged again)."""

    failover_wait_s: float = DEFAULT_FAILOVER_WAIT_S

    def execute_command(self, *args, **kwargs):
        return _ride_out(self.failover_wait_s, lambda: RedisCluster.execute_command(self, *args, **kwargs))

    def pipeline(self, transaction=None, shard_hint=None):
        pipe = super().pipeline(transaction=transaction, shard_hint=shard_hint)
        pipe.__class__ = FailoverClusterPipeline  # same state, this class's execute
        pipe.failover_wait_s = self.failover_wait_s
        return pipe


class FailoverClusterPipeline(ClusterPipeline):
    failover_wait_s: float = DEFAULT_FAILOVER_WAIT_S

    def execute(self, raise_on_error: bool = True):
        staged = [(c.args, c.options) for c in self._execution_strategy.command_queue]
        first = [True]

        def attempt():
            if not first[0]:  # the failed try's execute() emptied the pipeline: stage again
                for args, options in staged:
                    self.execute_command(*args, **options)
            first[0] = False
            return ClusterPipeline.execute(self, raise_on_error)

        return _ride_out(self.failover_wait_s, attempt)


# -- keys ----------------------------------------------------------------------------------------
def hash_tag(key: str) -> str | None:
    """The part of ``key`` Redis Cluster hashes when it has one: between the first ``{`` and the
    first ``}`` after it, if not empty; None when the whole key is hashed."""
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end <= start + 1:
        return None
    return key[start + 1:end]


def companion_key(key: str, suffix: str) -> str:
    """A key in ``key``'s slot, for a script or transaction that touches both: ``key`` +
    ``suffix`` when ``key`` has a hash tag, else ``{key}`` + ``suffix`` (a key without a tag is
    hashed whole, which is what the tag ``{key}`` hashes): existing keys keep their names."""
    if hash_tag(key) is not None:
        return key + suffix
    if "{" in key or "}" in key:
        raise ValueError(f"no companion for {key!r}: braces without a hash tag")
    return f"{{{key}}}{suffix}"


def slot(key: str) -> int:
    """The cluster slot of ``key`` (CRC16 of its hash tag or of the whole key, mod 16384)."""
    return key_slot(key.encode())


# -- Celery --------------------------------------------------------------------------------------
class BrokerConfigError(ValueError):
    pass


def celery_broker(broker_url: str, redis_url: str) -> tuple[str, dict]:
    """Celery's broker URL and extra transport options for ``CELERY_BROKER_URL`` (which the
    settings default to ``REDIS_URL``): the Sentinel form becomes kombu's ``sentinel://``
    transport with its ``master_name``; a cluster is refused with what to do instead."""
    kind = kind_of(broker_url)
    if kind == "cluster":
        named = ("REDIS_URL names a Redis Cluster and CELERY_BROKER_URL is not set"
                 if broker_url == redis_url else "CELERY_BROKER_URL names a Redis Cluster")
        raise BrokerConfigError(
            f"{named}: Celery cannot use a Redis Cluster as its broker. Set CELERY_BROKER_URL to "
            "RabbitMQ (amqp://user:pass@host:5672/vhost, recommended), a Redis Sentinel service "
            "(redis+sentinel://host:26379,host:26379/SERVICE/DB) or a plain Redis (redis://host:6379/DB)")
    if (broker_url or "").lower().startswith("sentinel://"):
        raise BrokerConfigError(
            "CELERY_BROKER_URL: write a Sentinel broker as redis+sentinel://host:port[,host:port]/SERVICE[/DB] "
            "(kombu's sentinel:// needs its master name apart)")
    if kind == "single":
        return broker_url, {}
    target = parse(broker_url)
    if target.ssl:
        raise BrokerConfigError("CELERY_BROKER_URL: Celery's Sentinel transport here is plain TCP "
                                "(rediss+sentinel:// is for REDIS_URL only)")
    auth = ""
    if target.username or target.password:
        auth = f"{quote(target.username or '', safe='')}:{quote(target.password or '', safe='')}@"
    url = ";".join(f"sentinel://{auth}{_netloc(host)}:{port}/{target.db}" for host, port in target.nodes)
    sentinel_kwargs = {k: v for k, v in (("username", target.sentinel_username),
                                         ("password", target.sentinel_password)) if v}
    options = {"master_name": target.service}
    if sentinel_kwargs:
        options["sentinel_kwargs"] = sentinel_kwargs
    return url, options


def _netloc(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def check_settings(settings) -> None:
    """At start (the web app, Celery): ``ConfigError`` for a ``REDIS_URL`` or
    ``CELERY_BROKER_URL`` this module cannot use, before any request or task meets it."""
    from app.config import ConfigError

    try:
        parse(settings.redis_url)
    except ValueError as exc:
        raise ConfigError(f"invalid configuration: REDIS_URL {exc}") from None
    broker = settings.celery_broker_url or settings.redis_url
    try:
        if kind_of(broker) != "single":
            parse(broker)
        celery_broker(broker, settings.redis_url)
    except BrokerConfigError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"invalid configuration: CELERY_BROKER_URL {exc}") from None
