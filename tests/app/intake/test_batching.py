"""BatchThread: one thread per process takes what waits as one batch, exits when idle, and
keeps going after a batch that fails."""

from __future__ import annotations

import threading
import time

from app.intake.batching import BatchThread


def _wait(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_items_that_wait_together_are_one_batch_in_order_up_to_the_limit():
    batches, gate = [], threading.Event()

    def handle(batch):
        gate.wait(5)  # the first batch holds the thread while the rest queue up
        batches.append(batch)

    worker = BatchThread("t", handle, max_batch=4)
    worker.put(0)
    time.sleep(0.1)
    for item in range(1, 10):
        worker.put(item)
    gate.set()
    _wait(lambda: sum(map(len, batches)) == 10)
    assert batches == [[0], [1, 2, 3, 4], [5, 6, 7, 8], [9]]


def test_an_idle_thread_exits_and_the_next_item_starts_another():
    seen = []
    worker = BatchThread("t", seen.extend, idle_s=0.1)
    worker.put("a")
    _wait(lambda: seen == ["a"])
    first = worker._thread
    _wait(lambda: not first.is_alive())
    assert worker._thread is None
    worker.put("b")
    _wait(lambda: seen == ["a", "b"])
    assert worker._thread is not first


def test_a_failing_batch_is_logged_and_the_next_one_is_handled(caplog):
    seen = []

    def handle(batch):
        if batch == ["bad"]:
            raise ValueError("boom")
        seen.extend(batch)

    worker = BatchThread("t", handle)
    worker.put("bad")
    _wait(lambda: "a batch of 1 failed" in caplog.text)
    worker.put("good")
    _wait(lambda: seen == ["good"])


def test_flush_returns_once_everything_put_before_it_is_handled():
    seen, gate = [], threading.Event()

    def handle(batch):
        gate.wait(5)
        seen.extend(batch)

    worker = BatchThread("t", handle)
    for item in range(3):
        worker.put(item)
    assert not worker.flush(0.1)  # the handler is held: not done yet
    gate.set()
    assert worker.flush(5)
    assert seen == [0, 1, 2]  # the markers never reach the handler
