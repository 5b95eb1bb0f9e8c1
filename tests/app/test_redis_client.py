"""REDIS_URL's forms (one server, Redis Cluster, Sentinel), the client each builds, Celery's broker
for each, and keys that must share a cluster slot."""

from __future__ import annotations

import re

import pytest
import redis
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError

from app import redis_client
from app.config import ConfigError
from app.redis_client import (
    BrokerConfigError,
    FailoverRedisCluster,
    celery_broker,
    companion_key,
    hash_tag,
    parse,
    slot,
)
from tests.support.env import make_env, redis_url, settings_from


def test_a_plain_url_is_one_server_as_before():
    target = parse("redis://:pw@10.0.0.1:6380/3")
    assert target.kind == "single" and target.url == "redis://:pw@10.0.0.1:6380/3"
    client = redis_client.from_url(redis_url(13))
    assert type(client) is redis.Redis
    assert client.connection_pool.connection_kwargs["socket_timeout"] == 2
    assert client.connection_pool.connection_kwargs["db"] == 13


def test_cluster_url_lists_the_startup_nodes():
    target = parse("redis+cluster://app:s%40cret@10.0.0.1:7000,10.0.0.2,[fd00::3]:7002/?failover_wait=4.5")
    assert target.kind == "cluster" and not target.ssl
    assert target.nodes == (("10.0.0.1", 7000), ("10.0.0.2", 6379), ("fd00::3", 7002))
    assert (target.username, target.password, target.failover_wait_s) == ("app", "s@cret", 4.5)
    assert "s@cret" not in repr(target)
    assert parse("rediss+cluster://h:7000").ssl
    assert parse("redis+cluster://h:7000/0").db == 0


@pytest.mark.parametrize("url, message", [
    ("redis+cluster://h:7000/2", "database 0 only"),
    ("redis+cluster:///", "at least one host"),
    ("redis+cluster://h:x", "bad port"),
    ("redis+cluster://h:7000/?db=1", "unknown redis+cluster:// option(s) db"),
    ("redis+cluster://h:7000/?failover_wait=soon", "number of seconds"),
    ("redis+sentinel://h:26379", "needs the Sentinel service name"),
    ("redis+sentinel://h:26379/mymaster/x", "must be a number"),
    ("redis+sentinel://h:26379/a/1/2", "needs the Sentinel service name"),
])
def test_bad_urls_say_what_is_wrong(url, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse(url)


def test_sentinel_url_names_the_service_and_db():
    target = parse("redis+sentinel://:pw@s1:26379,s2:26380,s3/mymaster/2?sentinel_password=spw")
    assert target.kind == "sentinel"
    assert target.nodes == (("s1", 26379), ("s2", 26380), ("s3", 26379))
    assert (target.service, target.db, target.password, target.sentinel_password) == ("mymaster", 2, "pw", "spw")
    assert parse("redis+sentinel://s1/mymaster").db == 0


def test_the_cluster_client_is_built_without_contacting_anything_until_used():
    # RedisCluster connects in its constructor: a port where nothing listens fails fast, as a
    # cluster that is down at start does (the processes retry their start).
    with pytest.raises(Exception):  # noqa: B017 - redis-py's RedisClusterException
        redis_client.from_url("redis+cluster://127.0.0.1:1/?failover_wait=0")
    assert issubclass(FailoverRedisCluster, RedisCluster)


def test_the_sentinel_client_asks_for_the_service_primary():
    client = redis_client.from_url("redis+sentinel://:pw@127.0.0.1:1/mymaster/3?failover_wait=0")
    pool = client.connection_pool
    assert pool.service_name == "mymaster" and pool.connection_kwargs["db"] == 3
    assert pool.connection_kwargs["password"] == "pw"
    with pytest.raises(RedisConnectionError):  # no Sentinel there
        client.get("x")


def test_a_failover_is_waited_out_then_given_up(monkeypatch):
    calls, sleeps = [], []
    monkeypatch.setattr(redis_client.time, "sleep", sleeps.append)

    def flaky():
        calls.append(1)
        if len(calls) < 4:
            raise RedisConnectionError("refused")
        return "ok"

    assert redis_client._ride_out(10, flaky) == "ok"
    assert sleeps == [0.05, 0.1, 0.2]
    clock = iter([0.0, 0.0, 0.5, 1.0, 99.0])
    monkeypatch.setattr(redis_client.time, "monotonic", lambda: next(clock))
    with pytest.raises(RedisConnectionError):
        redis_client._ride_out(1, lambda: (_ for _ in ()).throw(RedisConnectionError("down")))


def test_redirections_used_up_during_a_migration_are_waited_out(monkeypatch):
    monkeypatch.setattr(redis_client.time, "sleep", lambda s: None)
    calls = []

    def migrating():
        calls.append(1)
        if len(calls) < 3:
            raise redis.exceptions.ClusterError("TTL exhausted.")
        return "ok"

    assert redis_client._ride_out(10, migrating) == "ok" and len(calls) == 3


def test_other_errors_are_not_retried(monkeypatch):
    monkeypatch.setattr(redis_client.time, "sleep", lambda s: pytest.fail("slept"))
    with pytest.raises(redis.ResponseError):
        redis_client._ride_out(10, lambda: (_ for _ in ()).throw(redis.ResponseError("WRONGTYPE")))


def test_companion_keys_share_the_slot_of_the_key():
    for key in ("conv:3f2a9c", "conv:" + "ab" * 32, "{aibot:ws}:pending", "a{b}c"):
        assert slot(companion_key(key, ":ref")) == slot(key), key
    assert companion_key("conv:abc", ":ref") == "{conv:abc}:ref"
    assert companion_key("{t}:x", ":y") == "{t}:x:y"
    assert hash_tag("{conv:abc}:ref") == "conv:abc" and hash_tag("a{}b") is None and hash_tag("ab") is None
    with pytest.raises(ValueError):
        companion_key("odd}{key", ":x")


def test_conversation_keys_share_a_slot():
    from worker.conversation import ConversationStore

    keys = ConversationStore._key("u" * 64), ConversationStore._ref_key("u" * 64)
    assert keys[0] == "conv:" + "u" * 64 and slot(keys[0]) == slot(keys[1])


def test_celery_broker_refuses_a_cluster_and_translates_sentinel():
    cluster = "redis+cluster://10.0.0.1:7000,10.0.0.2:7000/"
    with pytest.raises(BrokerConfigError, match="REDIS_URL names a Redis Cluster and CELERY_BROKER_URL is not set"):
        celery_broker(cluster, cluster)
    with pytest.raises(BrokerConfigError, match="CELERY_BROKER_URL names a Redis Cluster"):
        celery_broker(cluster, "redis://r:6379/0")
    assert celery_broker("amqp://g:g@mq:5672/v", cluster) == ("amqp://g:g@mq:5672/v", {})
    assert celery_broker("redis://r:6379/1", cluster) == ("redis://r:6379/1", {})
    url, options = celery_broker("redis+sentinel://:p%3Aw@s1:26379,s2:26380/mymaster/1?sentinel_password=x",
                                 cluster)
    assert url == "sentinel://:p%3Aw@s1:26379/1;sentinel://:p%3Aw@s2:26380/1"
    assert options == {"master_name": "mymaster", "sentinel_kwargs": {"password": "x"}}
    with pytest.raises(BrokerConfigError, match="redis\\+sentinel://"):
        celery_broker("sentinel://s1:26379", cluster)


def test_kombu_reads_the_sentinel_broker_url():
    from kombu import Connection

    url, _ = celery_broker("redis+sentinel://:pw@s1:26379,s2:26380/mymaster/1", "redis://r/0")
    connection = Connection(url)
    assert connection.transport_cls == "sentinel" and connection.alt == url.split(";")
    assert (connection.hostname, connection.port, connection.password, connection.virtual_host) == \
        ("s1", 26379, "pw", "1")


def test_the_translated_sentinel_broker_wins_over_celerys_environment_variable(monkeypatch):
    """Celery reads CELERY_BROKER_URL from the environment before its own setting: the worker's
    connections must still get kombu's sentinel:// form, not the redis+sentinel:// one."""
    from app.broker.task_queue import make_celery

    url = "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/1"
    monkeypatch.setenv("CELERY_BROKER_URL", url)
    app = make_celery(settings_from(make_env(CELERY_BROKER_URL=url)))
    for connection in (app.connection_for_write(), app.connection_for_read(), app.connection()):
        assert (connection.transport_cls, connection.hostname, connection.port, connection.virtual_host) == \
            ("sentinel", "127.0.0.1", 26379, "1")
        assert connection.transport_options["master_name"] == "mymaster"


def test_a_cluster_redis_url_without_a_broker_fails_at_start():
    from app.broker.task_queue import make_celery

    settings = settings_from(make_env(REDIS_URL="redis+cluster://127.0.0.1:7000/"))
    with pytest.raises(ConfigError, match="Celery cannot use a Redis Cluster"):
        make_celery(settings)
    with pytest.raises(ConfigError, match="Celery cannot use a Redis Cluster"):
        from app.web.factory import create_app

        create_app(settings)
    with pytest.raises(ConfigError, match="REDIS_URL a Redis Cluster has database 0 only"):
        redis_client.check_settings(settings_from(make_env(REDIS_URL="redis+cluster://h:1/3",
                                                           CELERY_BROKER_URL="amqp://g@mq//")))
    ok = settings_from(make_env(REDIS_URL="redis+cluster://127.0.0.1:7000/",
                                CELERY_BROKER_URL="redis+sentinel://127.0.0.1:26379/mymaster/2"))
    app = make_celery(ok)
    assert app.conf.broker_url == "sentinel://127.0.0.1:26379/2"
    assert app.conf.broker_transport_options["master_name"] == "mymaster"
    assert app.conf.broker_transport_options["visibility_timeout"] == 600
