"""The worker's own Prometheus endpoint and its scrape-time collectors.

The worker is a separate process (often a separate container on the GPU host), so it serves
its metrics itself on ``METRICS_PORT`` (0 = off) instead of sharing gunicorn's multiprocess
directory: Prometheus scrapes both targets and sums them. With the threads pool the worker is
one process, so the default registry is complete: the message counters of ``app.metrics.counters``
(finished messages, latency, tokens, rate limits) plus the engine's state, read at scrape time:

- ``wecom_bot_kv_cache_blocks{pool, state}``: the paged KV cache's blocks used and free (pool
  ``kv`` for the window blocks, ``node`` for the key-node pages of sparse attention);
- ``wecom_bot_engine_requests{state}``: sequences running and waiting in the scheduler;
- ``wecom_bot_speculative_*``: per draft position, drafts proposed and accepted, and the
  accepted length per verify round, from ``inference.engine.speculative.SpeculativeStats``.
"""

from __future__ import annotations

import logging

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from worker import runtime

log = logging.getLogger(__name__)


class EngineCollector(Collector):
    """KV-cache use and scheduler queues of the bundled engine, once it is loaded."""

    def __init__(self, engine_of):
        self.engine_of = engine_of  # () -> inference.engine.LLMEngine | None

    def collect(self):
        engine = self.engine_of()
        if engine is None:
            return
        blocks = GaugeMetricFamily("wecom_bot_kv_cache_blocks",
                                   "Paged KV-cache blocks of the engine, used and free",
                                   labels=["pool", "state"])
        manager = engine.block_manager
        for pool, blocks_of in (("kv", manager.blocks), ("node", manager.nodes)):
            if blocks_of is None:
                continue
            total, free = len(blocks_of.ref_counts), blocks_of.num_free
            blocks.add_metric([pool, "used"], total - free)
            blocks.add_metric([pool, "free"], free)
        yield blocks
        requests = GaugeMetricFamily("wecom_bot_engine_requests",
                                     "Sequences in the engine's scheduler", labels=["state"])
        requests.add_metric(["running"], len(engine.scheduler.running))
        requests.add_metric(["waiting"], len(engine.scheduler.waiting))
        yield requests


class SpeculativeCollector(Collector):
    """Speculative-decoding acceptance, summed over the decoders ``stats_of`` returns."""

    def __init__(self, stats_of):
        self.stats_of = stats_of  # () -> list[SpeculativeStats]

    def collect(self):
        all_stats = list(self.stats_of())
        if not all_stats:
            return
        k = max(s.k for s in all_stats)
        proposed = CounterMetricFamily("wecom_bot_speculative_proposed",
                                       "Draft tokens proposed, by draft position", labels=["position"])
        accepted = CounterMetricFamily("wecom_bot_speculative_accepted",
                                       "Draft tokens accepted by the model, by draft position",
                                       labels=["position"])
        for i in range(k):
            proposed.add_metric([str(i)], sum(s.proposed[i] for s in all_stats if i < s.k))
            accepted.add_metric([str(i)], sum(s.accepted[i] for s in all_stats if i < s.k))
        yield proposed
        yield accepted
        counts = [sum(s.length_counts[n] for s in all_stats if n <= s.k) for n in range(k + 1)]
        buckets, running = [], 0
        for n, count in enumerate(counts):
            running += count
            buckets.append((str(float(n)), running))
        buckets.append(("+Inf", running))
        total = sum(n * c for n, c in enumerate(counts))
        yield HistogramMetricFamily("wecom_bot_speculative_accepted_length",
                                    "Drafts accepted per verify round (0..k)",
                                    buckets=buckets, sum_value=total)


def engine_of_runtime():
    """The running processor's engine, or None (not loaded yet, or the ``openai`` backend)."""
    processor = runtime.current()
    llm = processor.loaded_llm if processor is not None else None
    service = getattr(llm, "service", None)
    return getattr(service, "engine", None)


def speculative_stats_of_runtime() -> list:
    engine = engine_of_runtime()
    stats = getattr(engine, "speculative_stats", None)
    return [stats] if stats is not None else []


def serve(port: int, addr: str = "127.0.0.1", registry=REGISTRY) -> bool:
    """Start the endpoint in a daemon thread; False (logged) when the port is taken.

    It has no authentication: bind it to loopback or a private network (``METRICS_ADDR``)."""
    if port <= 0:
        return False
    registry.register(EngineCollector(engine_of_runtime))
    registry.register(SpeculativeCollector(speculative_stats_of_runtime))
    try:
        start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        log.error("worker metrics not served: port %s unavailable (%s)", port, exc.strerror)
        return False
    log.info("worker metrics on %s:%s", addr, port)
    return True
