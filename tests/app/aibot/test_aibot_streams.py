"""The AI bot's stream state on real Redis (DB 4): sealed text, finished once, the worker's deadline."""

import os

import pytest
import redis

from app.aibot.streams import StreamStore
from app.llm import Generation, GenerationParams, StreamDelta
from app.security import FieldCipher
from tests.support.env import redis_url
from worker.delivery.stream import DEADLINE, stream_generation
from worker.delivery.stream_writer import StreamWriter

pytestmark = pytest.mark.integration


@pytest.fixture
def store():
    client = redis.Redis.from_url(redis_url(4))
    client.flushdb()
    yield StreamStore(client, FieldCipher({"k1": os.urandom(32)}), 900)
    client.flushdb()
    client.close()


def test_text_is_sealed_and_a_finished_stream_never_changes(store):
    store.open("S1", 7, 1000.0)
    assert store.write("S1", 7, 1000.0, "机密的部分回答", finish=False)
    raw = store.redis.hgetall(store.key("S1"))
    assert "机密".encode() not in b"".join(raw.values())
    assert 0 < store.redis.ttl(store.key("S1")) <= 900
    assert store.write("S1", 7, 1000.0, "机密的完整回答", finish=True)
    assert not store.write("S1", 7, 1000.0, "late words", finish=False)
    assert not store.write("S1", 7, 1000.0, "another end", finish=True)
    state = store.get("S1")
    assert (state.message_id, state.started, state.text, state.finished) == (7, 1000.0, "机密的完整回答", True)
    assert store.get("nope") is None


def test_a_stream_lost_from_redis_is_written_again_with_its_start(store):
    store.write("S2", 8, 1234.5, "after a Redis restart", finish=False)
    assert store.get("S2").started == 1234.5


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


class CountingModel:
    """Streams one piece per call of ``next``; counts how far it got and whether it was closed."""

    model_name = "counting"

    def __init__(self, pieces: list[str], on_piece=None):
        self.pieces, self.on_piece = pieces, on_piece
        self.sent = 0
        self.closed = False

    def stream(self, messages, params):
        try:
            for piece in self.pieces:
                self.sent += 1
                if self.on_piece:
                    self.on_piece(self.sent)
                yield StreamDelta(piece)
            yield StreamDelta("", Generation("".join(self.pieces), self.model_name, 5, len(self.pieces)))
        finally:
            self.closed = True


def test_the_stream_grows_and_a_complete_answer_keeps_the_models_usage(store):
    writer = StreamWriter(store, "S3", 9, 1000.0, deadline_s=330, throttle_s=0, clock=Clock(1001.0))
    seen = []
    model = CountingModel(["年假", "有", "十天"], on_piece=lambda n: seen.append(store.get("S3")))
    generation = stream_generation(model, [{"role": "user", "content": "q"}], GenerationParams(), writer)
    assert generation.text == "年假有十天" and generation.completion_tokens == 3
    assert [s.text for s in seen[1:]] == ["年假", "年假有"]  # what a refresh saw between pieces
    assert not store.get("S3").finished  # the processor finishes it, after storing the reply
    assert writer.finish(generation.text) and store.get("S3").text == "年假有十天"


def test_past_the_deadline_generation_stops_and_is_aborted(store):
    clock = Clock(1000.0)
    writer = StreamWriter(store, "S4", 10, 1000.0, deadline_s=330, throttle_s=0, clock=clock)

    def time_passes(n):
        if n == 3:
            clock.now = 1000.0 + 331

    model = CountingModel(["一", "二", "三", "四", "五"], on_piece=time_passes)
    generation = stream_generation(model, [{"role": "user", "content": "问题"}], GenerationParams(), writer)
    assert generation.finish_reason == DEADLINE and generation.text == "一二三"
    assert model.sent == 3 and model.closed  # the model was told to stop, not drained
    assert generation.completion_tokens == len("一二三".encode()) and generation.prompt_tokens > 0  # estimated
    assert store.get("S4").text == "一二"


def test_a_stream_finished_by_the_callback_stops_the_worker(store):
    writer = StreamWriter(store, "S5", 11, 1000.0, deadline_s=330, throttle_s=0, clock=Clock(1001.0))
    assert not writer.finished_already()
    store.write("S5", 11, 1000.0, "超时了", finish=True)
    assert writer.finished_already()
    assert writer("more") is False and writer.closed_elsewhere
    assert writer.finish("the answer") is False and store.get("S5").text == "超时了"
