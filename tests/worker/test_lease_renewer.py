"""The shared lease renewer: each lease renewed about every third of its length, a lost one
marked, none renewed after its message's exit."""

import contextlib
import time

from worker import processor


class _Services:
    db = None


@contextlib.contextmanager
def _no_statements(db):
    yield None


def test_renews_each_lease_until_exit_and_marks_a_lost_one(monkeypatch):
    renewed = []
    monkeypatch.setattr(processor, "standalone", _no_statements)
    monkeypatch.setattr(processor.rows, "renew_lease",
                        lambda session, message_id, owner, lease_s: renewed.append(message_id) or message_id != 2)
    with processor.LeaseKeeper(_Services(), 1, "a", 0.06) as kept, \
            processor.LeaseKeeper(_Services(), 2, "b", 0.06) as lost:
        time.sleep(0.2)
        assert lost.lost.is_set() and not kept.lost.is_set()
        assert renewed.count(1) >= 3 and renewed.count(2) == 1
    after = len(renewed)
    time.sleep(0.1)
    assert len(renewed) == after  # gone with the exit
