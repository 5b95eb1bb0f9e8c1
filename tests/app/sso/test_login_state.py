"""A started WeCom sign-in (app/sso/login_state.py) against real Redis: single use across
workers, expiring, bound to the verifier only the starting browser holds; codes used once."""

from __future__ import annotations

import threading
import time

import pytest

from app.sso.login_state import LoginStates, Pending, StateRefused


@pytest.fixture
def states(redis_client):
    return LoginStates(redis_client, ttl_s=300)


def refused(states, pending, state) -> str:
    with pytest.raises(StateRefused) as caught:
        states.finish(pending, state)
    return caught.value.outcome


def test_a_sign_in_finishes_once_with_what_it_started_with(states):
    pending = states.begin("qr", "/admin/budgets")
    assert states.finish(pending, pending.state)["next"] == "/admin/budgets"
    assert refused(states, pending, pending.state) == "state_spent"


def test_only_one_of_many_workers_finishing_the_same_state_wins(states):
    pending = states.begin("qr")
    results, start = [], threading.Barrier(8)

    def finish():
        start.wait()
        try:
            states.finish(pending, pending.state)
            results.append("ok")
        except StateRefused as exc:
            results.append(exc.outcome)

    threads = [threading.Thread(target=finish) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["ok"] + ["state_spent"] * 7


def test_the_cookie_must_hold_the_state_and_its_verifier(states):
    pending = states.begin("qr")
    other = states.begin("qr")  # another browser's, valid in Redis
    assert refused(states, None, pending.state) == "no_session"
    assert refused(states, pending, other.state) == "bad_state"
    assert refused(states, pending, "") == "bad_state"
    assert refused(states, pending, "x" * 600) == "bad_state"
    # The state seen on its way through WeCom, with a cookie forged without the verifier:
    assert refused(states, Pending(pending.state, "guessed"), pending.state) == "bad_verifier"
    # ... which spent it: the genuine browser has to start again.
    assert refused(states, pending, pending.state) == "state_spent"


def test_a_started_sign_in_expires(redis_client):
    states = LoginStates(redis_client, ttl_s=1)
    pending = states.begin("oauth")
    time.sleep(1.2)
    assert refused(states, pending, pending.state) == "state_spent"


def test_redis_keeps_only_digests(states, redis_client):
    pending = states.begin("qr")
    stored = b"".join(redis_client.get(k) + k for k in redis_client.scan_iter("wecom-login:*"))
    assert pending.state.encode() not in stored and pending.verifier.encode() not in stored


def test_a_code_is_claimed_once(states):
    states.claim_code("CODE-1")
    with pytest.raises(StateRefused, match="code_replayed"):
        states.claim_code("CODE-1")
    with pytest.raises(StateRefused, match="bad_code"):
        states.claim_code("")
    states.claim_code("CODE-2")


def test_the_session_value_is_checked_before_use():
    assert Pending.from_session(None) is None
    assert Pending.from_session({"state": 1, "verifier": "v"}) is None
    assert Pending.from_session("state") is None
    assert Pending.from_session({"state": "s", "verifier": "v"}) == Pending("s", "v")
