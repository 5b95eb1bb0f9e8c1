"""Admin login under attack: parallel guesses, many names from one address, memory, locks.

The lockout must count every guess (parallel ones too) and check at most ``ADMIN_LOCKOUT_ATTEMPTS``
passwords against the real hash per lockout; argon2 (64 MiB a check) runs outside any database
transaction and a few at a time per process; one address and everyone together are rate-limited;
and the page answers an unknown name, a wrong password and a locked account alike.
"""

from __future__ import annotations

import re
import threading
import time

import pytest
import redis
from sqlalchemy import select

from app.models import AdminUser
from app.services import Services
from app.web.admin import accounts
from app.web.factory import create_app
from tests.app.web.admin.conftest import PASSWORD, TOKEN, login
from tests.support.databases import REDIS_URL
from tests.support.env import make_env, settings_from


@pytest.fixture(autouse=True)
def fresh_limits():
    client = redis.Redis.from_url(REDIS_URL)  # the limited app's (the others': conftest.py)
    for key in client.scan_iter("ratelimit:admin-login:*"):
        client.delete(key)
    client.close()


@pytest.fixture
def real_checks(monkeypatch):
    """Counts the password checks against a real account's hash (not the dummy), and the most
    that ran at once."""
    real = accounts._verify
    stats = {"real": 0, "running": 0, "peak": 0}
    lock = threading.Lock()

    def counting(password_hash, password):
        with lock:
            stats["real"] += password_hash != accounts._DUMMY_HASH
            stats["running"] += 1
            stats["peak"] = max(stats["peak"], stats["running"])
        try:
            time.sleep(0.02)  # let the parallel ones overlap
            return real(password_hash, password)
        finally:
            with lock:
                stats["running"] -= 1

    monkeypatch.setattr(accounts, "_verify", counting)
    return stats


def _parallel_logins(app, name: str, n: int, password: str = "not the password") -> list[int]:
    statuses: list[int] = []
    clients = []
    for i in range(n):
        client = app.test_client()
        client.environ_base["REMOTE_ADDR"] = f"10.0.{i // 250}.{i % 250 + 1}"
        page = client.get("/admin/login").get_data(as_text=True)
        clients.append((client, TOKEN.search(page).group(1)))
    barrier = threading.Barrier(n)

    def attempt(client, token):
        barrier.wait()
        response = client.post("/admin/login", data={"name": name, "password": password, "csrf_token": token})
        statuses.append(response.status_code)

    threads = [threading.Thread(target=attempt, args=pair) for pair in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return statuses


def test_parallel_guesses_lock_after_at_most_five_real_checks(app, users, services, real_checks):
    statuses = _parallel_logins(app, "fiona", 20)
    assert statuses == [401] * 20
    assert real_checks["real"] <= 5, real_checks
    with services.db.session() as session:
        user = session.scalar(select(AdminUser).where(AdminUser.name == "fiona"))
    assert user.locked_until is not None
    # Locked: even the right password is not checked now.
    before = real_checks["real"]
    assert login(app.test_client(), "fiona").status_code == 401
    assert real_checks["real"] == before


def test_password_checks_run_a_few_at_a_time(app, users, real_checks):
    _parallel_logins(app, "nobody-at-all", 12)
    assert 1 <= real_checks["peak"] <= services_concurrency(app)


def services_concurrency(app) -> int:
    return app.extensions["services"].settings.admin_login_concurrency


def test_the_hash_is_checked_outside_any_transaction(app, users, services, monkeypatch):
    """While argon2 runs, another writer gets the database (SQLite has one write lock)."""
    real = accounts._verify
    wrote = []

    def verify_while_someone_writes(password_hash, password):
        def write():
            with services.db.transaction() as session:
                session.get(AdminUser, 1).last_login_at = None
            wrote.append(True)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        writer.join(5)
        return real(password_hash, password)

    monkeypatch.setattr(accounts, "_verify", verify_while_someone_writes)
    assert login(app.test_client(), "fiona", "not the password").status_code == 401
    assert wrote == [True]


def _message(response) -> str:
    text = response.get_data(as_text=True)  # without the token and the name typed in
    return re.sub(r'name="(csrf_token|name)"[^>]*>', "", text)


def test_unknown_names_wrong_passwords_and_locked_accounts_answer_alike(app, users, services):
    for _ in range(5):
        login(app.test_client(), "fiona", "not the password")
    unknown = login(app.test_client(), "nobody", "not the password")
    wrong = login(app.test_client(), "otto", "not the password")
    locked = login(app.test_client(), "fiona", PASSWORD)
    assert unknown.status_code == wrong.status_code == locked.status_code == 401
    assert _message(unknown) == _message(wrong) == _message(locked)


@pytest.fixture
def limited_app(database_url, db):
    settings = settings_from(make_env(DATABASE_URL=database_url, REDIS_URL=REDIS_URL,
                                      SESSION_COOKIE_SECURE="false", ADMIN_LOGIN_IP_LIMIT="3/min",
                                      ADMIN_LOGIN_GLOBAL_LIMIT="6/min"))
    flask_app = create_app(services=Services(settings, db))
    flask_app.config["TESTING"] = True
    return flask_app


def _from(app, address: str):
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    return client


def _a_fresh_minute_ahead(needed_s: float = 40.0) -> None:
    """The limits count in aligned minutes (app.ratelimit.window_count): a test that crossed one
    would start counting again midway. Wait for the next minute when this one is nearly over."""
    left = 60 - time.time() % 60
    if left < needed_s:
        time.sleep(left + 0.05)


def test_one_address_and_everyone_together_are_limited(limited_app, real_checks):
    _a_fresh_minute_ahead()
    statuses = [login(_from(limited_app, "10.1.1.1"), f"name{i}", "not the password").status_code
                for i in range(5)]
    assert statuses == [401, 401, 401, 429, 429]  # a name each time: only the address counts
    checks = real_checks["running"]
    others = [login(_from(limited_app, f"10.2.2.{i}"), "x", "not the password").status_code for i in range(5)]
    assert others == [401, 401, 401, 429, 429]  # 6 a minute for everyone: 3 used above
    assert real_checks["running"] == checks


def _account(services, name: str) -> AdminUser:
    with services.db.session() as session:
        return session.scalar(select(AdminUser).where(AdminUser.name == name))


def test_a_busy_last_attempt_gives_it_back_and_the_right_password_still_works(app, users, services,
                                                                              monkeypatch):
    """The 5th reserved attempt finds no password-check slot (LoginBusy): it was never
    checked, so it is not counted, and nothing is left locked for ever."""
    db = services.db
    for _ in range(4):
        assert accounts.authenticate(db, "fiona", "wrong").outcome == "bad_password"
    monkeypatch.setattr(accounts, "SLOT_WAIT_S", 0.05)
    with pytest.raises(accounts.LoginBusy):
        accounts.authenticate(db, "fiona", PASSWORD, slots=threading.Semaphore(0))
    user = _account(services, "fiona")
    assert (user.failed_attempts, user.locked_until) == (4, None)
    assert accounts.authenticate(db, "fiona", PASSWORD).outcome == "ok"
    assert _account(services, "fiona").failed_attempts == 0


def test_a_last_attempt_that_never_finished_leaves_a_lock_that_expires(app, users, services, monkeypatch):
    """The process dies while the 5th attempt's hash is checked: the account is locked for the
    lockout (the attempt counted), and a fresh count starts when the lock has passed."""
    from datetime import timedelta

    from app.db import utcnow

    db = services.db
    for _ in range(4):
        accounts.authenticate(db, "fiona", "wrong")

    def killed(password_hash, password):
        raise SystemExit("worker killed")  # what is left is what a kill leaves: nothing given back

    monkeypatch.setattr(accounts, "_check", lambda slots, h, p: killed(h, p))
    monkeypatch.setattr(accounts, "_give_back", lambda *args: None, raising=False)
    with pytest.raises(SystemExit):
        accounts.authenticate(db, "fiona", PASSWORD)
    monkeypatch.undo()
    user = _account(services, "fiona")
    assert user.failed_attempts == 5 and user.locked_until is not None
    assert accounts.authenticate(db, "fiona", PASSWORD).outcome == "locked"
    later = utcnow() + timedelta(minutes=16)
    assert accounts.authenticate(db, "fiona", PASSWORD, now=later).outcome == "ok"


def test_a_full_count_left_without_a_lock_is_not_locked_for_ever(app, users, services):
    """What the LoginBusy of a version before this fix left behind: failed_attempts at the
    limit and no locked_until. The right password works again (a fresh count)."""
    with services.db.transaction() as session:
        session.scalar(select(AdminUser).where(AdminUser.name == "fiona")).failed_attempts = 5
    assert accounts.authenticate(services.db, "fiona", PASSWORD).outcome == "ok"
