"""One serving engine per process, stepping in a background thread: the worker's engine backend
(`app/llm/engine_backend.py`) and the OpenAI-compatible server (`inference/server/serve.py`) both hold one.

Callers' threads (Celery task threads of the ``threads`` pool, the server's request threads)
call ``submit(messages_or_ids, params)`` and wait on the returned ``RequestStream`` (or iterate
it for text deltas). Submissions reach the engine
through a queue, and only the engine thread touches the engine, so concurrent chats are batched
together step by step: while one conversation decodes, another's prompt is prefilled in the
same forward.

Why not prefork with CUDA: a CUDA context cannot survive ``fork()`` (a child that touches the
parent's context fails; initialising CUDA before forking breaks every child), so each forked
child would have to load its own copy of the weights and reserve its own KV cache on the same
GPU, dividing memory by the number of children, and requests in different children can never
share a batch, which is where a serving engine's throughput comes from. Run one worker process
per GPU with ``--pool threads``.

Sizing a worker: ``concurrency`` about the engine's ``max_num_seqs`` (each task thread mostly
waits on its stream; more threads than sequences only queue inside the engine, fewer leave
batch slots empty); ``max_num_seqs`` and the KV budget (``gpu_memory_utilization`` on CUDA,
``kv_cache_bytes`` on CPU) so that ``max_num_seqs`` typical conversations fit in the cache at
once (about W + n/G positions each with sparse attention); requests beyond that wait in the
engine's queue rather than fail.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator

from inference.engine import LLMEngine, RequestFailedError, RequestOutput
from inference.sampling_params import SamplingParams

log = logging.getLogger(__name__)
_IDLE_WAIT_S = 0.5


class RequestStream:
    """The outputs of one request, as the engine thread delivers them."""

    def __init__(self, service: EngineService, request_id: str) -> None:
        self.service, self.request_id = service, request_id
        self._outputs: queue.Queue[RequestOutput | Exception] = queue.Queue()
        self.final: RequestOutput | None = None

    def _deliver(self, item: RequestOutput | Exception) -> None:
        self._outputs.put(item)

    def __iter__(self) -> Iterator[RequestOutput]:
        """Each step's output until the last (`finished`); raises the request's error."""
        done = False
        try:
            while not done:
                item = self._outputs.get()
                if isinstance(item, Exception):
                    done = True
                    raise item
                if item.error is not None:
                    done = True
                    raise item.error
                done = item.finished
                if done:
                    self.final = item
                yield item
        finally:
            if not done:  # the caller stopped listening: stop generating
                self.service.abort(self.request_id)

    def result(self) -> RequestOutput:
        for _ in self:
            pass
        return self.final


class EngineService:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._inbox: queue.Queue[tuple] = queue.Queue()
        self._streams: dict[str, RequestStream] = {}
        self._ids = 0
        self.steps = 0
        self.max_batch = 0  # most requests that got a token from one step: batching at work
        self._ids_lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine-service", daemon=True)
        self._thread.start()

    def submit(self, prompt, params: SamplingParams | None = None) -> RequestStream:
        """Queue chat messages, text or token ids; returns at once."""
        with self._ids_lock:
            self._ids += 1
            request_id = f"svc-{self._ids}"
        stream = RequestStream(self, request_id)
        self._inbox.put(("add", request_id, prompt, params or SamplingParams(), stream))
        return stream

    def alive(self) -> bool:
        """Whether the engine thread is stepping (a server's health check)."""
        return self._thread.is_alive() and not self._stopped.is_set()

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    def close(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        self._inbox.put(("wake",))
        self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._drain(block=not self.engine.has_unfinished_requests())
            if not self.engine.has_unfinished_requests():
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a bug, not one request: fail what is in flight, go on
                log.exception("engine step failed")
                self._fail_all(exc)
                continue
            self.steps += 1
            if len(outputs) > self.max_batch:
                self.max_batch = len(outputs)
                log.info("engine batch size reached %d requests in one step", self.max_batch)
            for output in outputs:
                stream = self._streams.get(output.request_id)
                if stream is not None:
                    if output.finished:
                        del self._streams[output.request_id]
                    stream._deliver(output)
        self._fail_all(RequestFailedError("engine service stopped"))

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=_IDLE_WAIT_S) if block else self._inbox.get_nowait()
            while True:
                self._handle(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            pass

    def _handle(self, item: tuple) -> None:
        if item[0] == "add":
            _, request_id, prompt, params, stream = item
            try:
                self.engine.add_request(prompt, params, request_id)
            except Exception as exc:  # PromptTooLongError, ValueError: that caller's problem
                stream._deliver(exc)
                return
            self._streams[request_id] = stream
        elif item[0] == "abort":
            self._streams.pop(item[1], None)
            self.engine.abort_request(item[1])

    def _fail_all(self, exc: Exception) -> None:
        for request_id, stream in list(self._streams.items()):
            self.engine.abort_request(request_id)
            error = RequestFailedError(f"engine failed: {type(exc).__name__}")
            error.__cause__ = exc
            stream._deliver(error)
        self._streams.clear()
