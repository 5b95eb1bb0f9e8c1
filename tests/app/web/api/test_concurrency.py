"""Requests in flight per API key (app/web/api/concurrency.py) on the real Redis: a key holds at
most its limit over every process; a slot comes back when released, or when the process that
held it died (its lease runs out), and a live holder's renewals keep a long stream's slot."""

from __future__ import annotations

import time

import redis as redis_lib

from app.web.api import concurrency
from app.web.api.concurrency import Holder, Slot


def test_a_key_holds_at_most_its_limit_across_processes(redis_client):
    one, two = Holder(redis_client), Holder(redis_client)  # two web processes
    first, second = one.acquire(7, 2), two.acquire(7, 2)
    assert isinstance(first, Slot) and isinstance(second, Slot)
    wait = one.acquire(7, 2)
    assert not isinstance(wait, Slot) and 0 < wait <= concurrency.LEASE_S
    assert isinstance(one.acquire(8, 2), Slot)  # another key is not affected
    second.release()
    second.release()  # idempotent: a stream's close and an error path may both give it back
    third = two.acquire(7, 2)
    assert isinstance(third, Slot)
    assert redis_client.zcard("api:inflight:7") == 2


def test_a_dead_processes_slots_expire_and_a_live_ones_are_renewed(redis_client, monkeypatch):
    monkeypatch.setattr(concurrency, "LEASE_S", 1.0)
    monkeypatch.setattr(concurrency, "RENEW_S", 0.3)
    live, dead = Holder(redis_client), Holder(redis_client)
    kept = live.acquire(9, 2)
    lost = dead.acquire(9, 2)
    assert isinstance(kept, Slot) and isinstance(lost, Slot)
    dead._held.clear()  # its process died: nobody renews its slot any more
    time.sleep(2.0)
    assert redis_client.zscore("api:inflight:9", kept.token) is not None  # renewed
    assert redis_client.zscore("api:inflight:9", lost.token) is None or \
        redis_client.zscore("api:inflight:9", lost.token) < time.time()
    assert isinstance(live.acquire(9, 2), Slot)  # the dead one's slot is free again
    assert not isinstance(live.acquire(9, 2), Slot)


def test_no_limit_and_redis_down_let_the_request_through():
    down = Holder(redis_lib.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2))
    assert isinstance(concurrency.acquire(down, 1, 2), Slot)
    assert isinstance(concurrency.acquire(down, 1, 0), Slot)
