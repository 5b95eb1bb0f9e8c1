"""The intake server (app/web/intake_server.py) and its client (app/intake/client.py), on SQLite and
PostgreSQL: every web thread's message is written once, with its audit event, in batches that
hold several connections' messages; bad requests are refused one by one; clients fall back to
writing in-process when the server is away, reconnect after a restart, and give up in time on a
server that does not answer."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time

import pytest
import sqlalchemy as sa

from app.intake.client import RemoteIntake
from app.intake.protocol import IntakeUnavailable
from app.intake.wire import HEADER, MAX_FRAME, encode
from app.metrics import counters as metrics
from app.models import AuditEvent, InboundMessage
from app.outbox.rows import Arrival, prepare
from app.web.intake_server import IntakeServer
from app.wecom.messages import parse_message
from tests.support.callbacks import text_message_xml


def _message(services, n: int, user: str = "zhangwei"):
    s = services.settings
    return parse_message(text_message_xml(s.wecom_corp_id, s.wecom_agent_id, f"第{n}条 message {n}", user, 5000 + n))


class Running:
    """An intake server on a thread of the test process."""

    def __init__(self, services, path: str, **options):
        self.server = IntakeServer(services, path, **options)
        self.server.listen()
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def socket_path(tmp_path):
    return str(tmp_path / "run" / "intake.sock")


@pytest.fixture
def server(services, socket_path):
    running = Running(services, socket_path, linger_s=0.02)
    yield running
    running.stop()


def _queued_task_ids(services) -> list[int]:
    queue = services.celery.conf.task_default_queue
    return [json.loads(base64.b64decode(json.loads(raw)["body"]))[0][0]
            for raw in services.redis.lrange(queue, 0, -1)]


def _wait(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return value


def test_every_threads_message_is_written_once_in_shared_batches(services, server, socket_path):
    services.redis.delete(services.celery.conf.task_default_queue)
    client = RemoteIntake(services, socket_path)
    results: dict[int, object] = {}

    def sender(t: int) -> None:  # a web thread: its own connection, one message after another
        for i in range(6):
            n = t * 6 + i
            results[n] = client.accept(Arrival(_message(services, n, user=f"user{t}"), f"req{n}"), "f" * 64)

    threads = [threading.Thread(target=sender, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    retry = client.accept(Arrival(_message(services, 7, user="user1"), "retry"))  # WeCom's retry

    assert len(results) == 48 and all(r.created for r in results.values())
    assert len({r.id for r in results.values()}) == 48
    assert not retry.created and retry.id == results[7].id
    stats = server.server.stats
    assert stats["messages"] == 49 and stats["connections"] >= 8
    assert stats["batches"] < stats["messages"]  # messages of several threads went together
    with services.db.session() as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(InboundMessage)) == 48
        assert services.audit.verify(session).ok
        received = session.scalars(sa.select(AuditEvent).where(AuditEvent.event_type == "message_received")).all()
        assert sorted(services.audit.payload_of(e)["message_id"] for e in received) == sorted(r.id for r in results.values())
        row = session.get(InboundMessage, results[9].id)
        assert services.cipher.decrypt(row.user_enc, "inbound_messages", "user_enc", row.id) == "user1"
        assert "第9条" in services.cipher.decrypt(row.payload_enc, "inbound_messages", "payload_enc", row.id)
    # each new row's task is published once, after its commit; the retry's is not
    def all_published():
        ids = _queued_task_ids(services)
        return ids if len(ids) >= 48 else None

    published = _wait(all_published)
    time.sleep(0.3)  # a wrongly published retry would have landed by now
    assert sorted(_queued_task_ids(services)) == sorted(published) == sorted(r.id for r in results.values())


def _raw(socket_path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(10)
    sock.connect(socket_path)
    return sock


class Answers:
    """The frames a raw connection receives, one at a time, in order."""

    def __init__(self, sock: socket.socket):
        self.sock, self.data = sock, b""

    def next(self):
        while len(self.data) < HEADER.size or len(self.data) < HEADER.size + HEADER.unpack_from(self.data)[0]:
            chunk = self.sock.recv(65536)
            assert chunk, "connection closed"
            self.data += chunk
        size = HEADER.unpack_from(self.data)[0]
        frame, self.data = self.data[HEADER.size:HEADER.size + size], self.data[HEADER.size + size:]
        return json.loads(frame)


def test_a_bad_request_is_refused_alone_and_the_connection_stays_usable(services, server, socket_path):
    good = prepare(services.blind_index, Arrival(_message(services, 1)))
    # A time past any 64-bit integer: the database refuses it (the parser would, too).
    overflowing = prepare(services.blind_index, Arrival(_message(services, 2))).to_wire()
    overflowing[6] = 10**30
    sock = _raw(socket_path)
    sock.sendall(encode("not a message") + encode(["too", "short"]) + HEADER.pack(5) + b"{oops")
    received = Answers(sock)
    answers = [received.next() for _ in range(3)]
    assert all("bad request" in a["error"] for a in answers)
    sock.sendall(encode(overflowing) + encode(good.to_wire()))
    refused, written = received.next(), received.next()
    assert "not written" in refused["error"]
    assert written[1] is True
    sock.close()
    with services.db.session() as session:
        assert session.scalars(sa.select(InboundMessage.id)).all() == [written[0]]
        assert services.audit.verify(session).ok


def test_a_frame_larger_than_any_message_closes_the_connection(server, socket_path):
    sock = _raw(socket_path)
    sock.sendall(HEADER.pack(MAX_FRAME + 1))
    assert sock.recv(10) == b""


def test_without_a_server_the_client_writes_in_process(services, socket_path, caplog):
    client = RemoteIntake(services, socket_path)  # nothing listens there
    fallbacks = metrics.INTAKE_FALLBACKS._value.get()
    with caplog.at_level("WARNING", logger="app.intake.client"):
        first = client.accept(Arrival(_message(services, 1)))
        second = client.accept(Arrival(_message(services, 1)))
    assert first.created and not second.created and second.id == first.id
    assert metrics.INTAKE_FALLBACKS._value.get() == fallbacks + 2
    assert "unreachable" in caplog.text and caplog.text.count("unreachable") == 1  # said once
    with services.db.session() as session:
        assert services.audit.verify(session).ok


def test_the_client_reconnects_to_a_restarted_server(services, socket_path):
    running = Running(services, socket_path)
    client = RemoteIntake(services, socket_path)
    assert client.accept(Arrival(_message(services, 1))).created
    running.stop()
    running = Running(services, socket_path)  # gunicorn started a new one
    try:
        assert client.accept(Arrival(_message(services, 2))).created  # on a new connection
        assert running.server.stats["messages"] == 1
        assert client._fallback is None  # never needed the in-process writer
    finally:
        running.stop()


def test_a_server_that_does_not_answer_makes_the_caller_give_up_in_time(services, socket_path, tmp_path):
    silent = socket.socket(socket.AF_UNIX)
    (tmp_path / "run").mkdir()
    silent.bind(socket_path)
    silent.listen(8)
    client = RemoteIntake(services, socket_path, timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(IntakeUnavailable, match="did not answer"):
        client.accept(Arrival(_message(services, 1)))
    assert time.monotonic() - started < 5
    silent.close()


def test_a_second_server_does_not_take_over_a_live_socket(services, server, socket_path):
    with pytest.raises(RuntimeError, match="already listens"):
        IntakeServer(services, socket_path).listen(wait_s=0.2)


def test_a_lone_client_is_not_held_back_by_lingering(services, socket_path):
    running = Running(services, socket_path, linger_s=0.5)
    try:
        client = RemoteIntake(services, socket_path)
        started = time.monotonic()
        for n in range(10):
            assert client.accept(Arrival(_message(services, n))).created
        # Lingering would hold each of them half a second: 5 s for the ten.
        assert time.monotonic() - started < 3
        assert running.server.stats["batches"] == 10
    finally:
        running.stop()


def test_the_socket_is_the_service_users_alone(server, socket_path):
    import os
    import stat

    assert stat.S_IMODE(os.stat(socket_path).st_mode) & 0o077 == 0
    assert stat.S_IMODE(os.stat(os.path.dirname(socket_path)).st_mode) & 0o077 == 0
