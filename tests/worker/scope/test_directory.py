"""One WeCom lookup of an employee's departments serves the budgets and the knowledge base:
shared through Redis, remembered in the process for a minute, never cached when it failed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from worker.scope.directory import UNKNOWN, Directory, Member


class _WeCom:
    def __init__(self, answer: dict | None):
        self.answer, self.asked = answer, 0

    def get_user(self, user_id):
        self.asked += 1
        if self.answer is None:
            raise RuntimeError("user/get failed")
        return self.answer


@pytest.fixture
def services(redis_client):
    return SimpleNamespace(redis=redis_client, settings=SimpleNamespace(department_cache_s=3600))


def test_one_lookup_serves_every_worker_and_the_process_remembers_it(services, redis_client):
    wecom = _WeCom({"department": [7, 3], "main_department": 3})
    first = Directory(services, wecom)
    assert first.member("h1", "alice") == Member("3", (3, 7))
    assert 3500 < redis_client.ttl("member:h1") <= 3600
    other_worker = Directory(services, wecom)
    assert other_worker.member("h1", "alice") == Member("3", (3, 7)) and wecom.asked == 1
    redis_client.delete("member:h1")
    assert first.member("h1", "alice") == Member("3", (3, 7))  # the process's own, for a minute
    assert wecom.asked == 1 and redis_client.get("member:h1") is None


def test_the_process_entry_expires(services, monkeypatch):
    wecom = _WeCom({"department": [5]})
    directory = Directory(services, wecom)
    monkeypatch.setattr(Directory, "LOCAL_S", 0.0)
    assert directory.member("h2", "bob") == Member("5", (5,))
    wecom.answer = {"department": [6]}
    services.redis.delete("member:h2")
    assert directory.member("h2", "bob") == Member("6", (6,)) and wecom.asked == 2


def test_a_failed_lookup_is_no_department_and_is_asked_again(services, redis_client):
    wecom = _WeCom(None)
    directory = Directory(services, wecom)
    assert directory.member("h3", "carol") is UNKNOWN
    assert redis_client.get("member:h3") is None
    wecom.answer = {"department": [2]}
    assert directory.member("h3", "carol") == Member("2", (2,)) and wecom.asked == 2


def test_the_process_remembers_a_bounded_number(services, monkeypatch):
    monkeypatch.setattr(Directory, "LOCAL_MAX", 2)
    directory = Directory(services, _WeCom({"department": [1]}))
    for user in ("a", "b", "c"):
        directory.member(user, user)
    assert list(directory._local) == ["b", "c"]


def test_a_change_event_forgets_the_member_everywhere(services, redis_client):
    wecom = _WeCom({"department": [7]})
    directory = Directory(services, wecom)
    assert directory.member("h5", "dave") == Member("7", (7,))
    wecom.answer = {"department": [4]}
    directory.forget("h5")  # WeCom's change_contact: update_user
    assert redis_client.get("member:h5") is None
    assert directory.member("h5", "dave") == Member("4", (4,)) and wecom.asked == 2


def test_ids_that_are_not_department_ids_never_reach_a_query(services):
    wecom = _WeCom({"department": [10**30, "7", -3, 5], "main_department": 10**30})
    assert Directory(services, wecom).member("h6", "erin") == Member("7", (5, 7))


def test_budgets_charge_the_department_last_seen_while_user_get_fails(services, redis_client):
    """Issue 50: a department budget must not fail open when WeCom's directory does."""
    wecom = _WeCom({"department": [7, 3], "main_department": 3})
    directory = Directory(services, wecom)
    assert directory.budget_department("h7", "frank") == "3"
    assert 89 * 86400 < redis_client.ttl("member:last:h7") <= Directory.LAST_KNOWN_S
    wecom.answer = None  # WeCom's directory fails from now on
    redis_client.delete("member:h7")
    directory._local.clear()
    assert directory.member("h7", "frank") is UNKNOWN  # the knowledge base: public only
    assert directory.budget_department("h7", "frank") == "3"  # the budget: the last one seen


def test_an_employee_never_seen_has_no_department_budget_while_user_get_fails(services):
    directory = Directory(services, _WeCom(None))
    assert directory.budget_department("h8", "grace") == ""
