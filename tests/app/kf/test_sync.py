"""kf/sync_msg into the outbox: each customer message one row, whoever reads and whatever dies
(real SQLite and PostgreSQL; WeCom's kf API is a stand-in with its cursor semantics)."""

import pytest
import sqlalchemy as sa

from app.kf import sync
from app.wecom.exceptions import WeComAPIError
from app.wecom.kf import SyncPage

ACCOUNT = "wkTestAccount01"


def item(n: int, origin: int = 3, customer: str = "wmCustomer01") -> dict:
    return {"msgid": f"msg{n:04d}", "open_kfid": ACCOUNT, "external_userid": customer,
            "send_time": 1_765_000_000 + n, "origin": origin, "msgtype": "text",
            "text": {"content": f"问题{n}"}}


class FakeKf:
    """kf/sync_msg over a log: cursor ``c<n>`` is a position; a page is the same every time."""

    def __init__(self, log, page_size=2):
        self.log, self.page_size, self.calls, self.before_answer = log, page_size, [], None

    def sync_msg(self, open_kfid, cursor="", token="", limit=1000):
        self.calls.append((cursor, token))
        if token == "expired":
            raise WeComAPIError(95007, "invalid msg token", {})
        start = int(cursor[1:]) if cursor else 0
        end = min(start + self.page_size, len(self.log))
        if self.before_answer is not None:
            hook, self.before_answer = self.before_answer, None
            hook()
        return SyncPage(f"c{end}", end < len(self.log), [dict(i) for i in self.log[start:end]])


@pytest.fixture
def published(monkeypatch):
    tasks = []
    monkeypatch.setattr(sync, "publish_tasks", lambda publisher, new: tasks.extend(new))
    return tasks


def kf_rows(services):
    with services.db.engine.connect() as conn:
        return conn.execute(sa.text("SELECT id, msg_type, user_hash, status FROM inbound_messages "
                                    "WHERE channel = 'kf' ORDER BY id")).all()


def test_customer_messages_become_rows_once_and_the_cursor_moves(services, published):
    api = FakeKf([item(1), item(2, origin=5), item(3), item(4, origin=4)])
    result = sync.sync_account(services, api, ACCOUNT, "tok")
    assert (result.pages, result.taken) == (2, 2)  # the servicer's and the system's are not ours
    assert len(kf_rows(services)) == 2 and len(published) == 2
    assert sync.read_cursor(services.db, ACCOUNT) == "c4"
    again = sync.sync_account(services, api, ACCOUNT, "tok")
    assert again.taken == 0 and len(kf_rows(services)) == 2
    assert api.calls[-1][0] == "c4"  # read on from the stored cursor, not from the start
    # The customer's id is sealed: no column holds it in clear.
    with services.db.engine.connect() as conn:
        assert "wmCustomer01" not in str(conn.execute(sa.text("SELECT * FROM inbound_messages")).all())


def test_a_crash_before_the_commit_reads_the_page_again_and_loses_nothing(services, published, monkeypatch):
    api = FakeKf([item(1), item(2)])
    real = sync.accept_many

    def dies(*args, **kwargs):
        raise RuntimeError("worker killed")

    monkeypatch.setattr(sync, "accept_many", dies)
    with pytest.raises(RuntimeError):
        sync.sync_account(services, api, ACCOUNT)
    assert kf_rows(services) == [] and sync.read_cursor(services.db, ACCOUNT) is None
    monkeypatch.setattr(sync, "accept_many", real)
    assert sync.sync_account(services, api, ACCOUNT).taken == 2
    assert len(kf_rows(services)) == 2


def test_two_readers_of_one_page_write_it_once(services, published):
    api = FakeKf([item(1), item(2), item(3)], page_size=3)
    other = FakeKf(api.log, page_size=3)
    # Between WeCom's answer and our commit, another worker reads and takes the same page.
    api.before_answer = lambda: sync.sync_account(services, other, ACCOUNT)
    result = sync.sync_account(services, api, ACCOUNT)
    assert result.lost_races == 1 and result.taken == 0
    assert len(kf_rows(services)) == 3 and len(published) == 3


def test_a_page_read_twice_is_one_row_per_msgid(services, published):
    """The cursor lost (restored from an old backup): the msgid still keys the row."""
    api = FakeKf([item(1), item(2)])
    sync.sync_account(services, api, ACCOUNT)
    with services.db.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM kf_cursors"))
    sync.sync_account(services, api, ACCOUNT)
    assert len(kf_rows(services)) == 2


def test_an_expired_callback_token_is_read_without_it(services, published):
    api = FakeKf([item(1)])
    assert sync.sync_account(services, api, ACCOUNT, "expired").taken == 1
    assert api.calls == [("", "expired"), ("", "")]
