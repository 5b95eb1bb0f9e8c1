"""The /v1 API through gunicorn: requests/s and time to first token.

Starts gunicorn with the real app (key check, rate limit in Redis, budget reservation and
settlement, usage row, sealed audit event) in front of the fake OpenAI-compatible model server
(``tests/support/openai_server.py``, which answers at once, or after ``--model-delay-ms``), and
for the baseline calls the fake server directly. Clients are threads of this process using
``requests`` at 1, 8 and 32 concurrent connections.

    python -m bench.api [--requests 400] [--workers 2] [--model-delay-ms 0]

Prints, per concurrency: non-streaming requests/s and p50/p99 latency; streaming time to first
token (first content chunk) p50/p99; and the same for the model server alone, so the gateway's
own cost per request is the difference.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import threading
import time
from pathlib import Path

import requests

from tests.support.api_server import MODEL, ApiServer

LEVELS = (1, 8, 32)
MESSAGES = [{"role": "user", "content": "基准测试 bench: what is the capital of France?"}]


def _one(session: requests.Session, url: str, headers: dict, stream: bool) -> tuple[float, float, bool]:
    """(seconds to first content, seconds in all, ok)."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 64, "stream": stream}
    started = time.perf_counter()
    first = None
    try:
        with session.post(url, json=body, headers=headers, stream=stream, timeout=60) as resp:
            if not stream:
                _ = resp.content
                first = time.perf_counter()
                ok = resp.status_code == 200
            else:
                ok = resp.status_code == 200
                for line in resp.iter_lines():
                    if first is None and line.startswith(b"data: {") and b'"content": "' in line \
                            and b'"content": ""' not in line:
                        first = time.perf_counter()
    except requests.RequestException:
        ok = False
    end = time.perf_counter()
    return (first or end) - started, end - started, ok


def load(url: str, headers: dict, total: int, concurrency: int, stream: bool) -> dict:
    results: list[tuple[float, float, bool]] = []
    lock = threading.Lock()
    counter = iter(range(total))

    def worker():
        session = requests.Session()
        local = []
        for _ in iter(lambda: next(counter, None), None):
            local.append(_one(session, url, headers, stream))
        with lock:
            results.extend(local)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    ttft = sorted(r[0] for r in results)
    total_s = sorted(r[1] for r in results)
    return {"rate": len(results) / elapsed, "errors": sum(not r[2] for r in results),
            "p50": statistics.median(total_s) * 1000, "p99": _p99(total_s) * 1000,
            "ttft50": statistics.median(ttft) * 1000, "ttft99": _p99(ttft) * 1000}


def _p99(values: list[float]) -> float:
    return values[max(int(len(values) * 0.99) - 1, 0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="per level and mode")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    parser.add_argument("--threads", type=int, default=16, help="threads per gunicorn worker")
    parser.add_argument("--model-delay-ms", type=float, default=0.0)
    args = parser.parse_args()

    server = ApiServer(Path(tempfile.mkdtemp(prefix="bench-api-")), workers=args.workers,
                       threads=args.threads, model_delay_s=args.model_delay_ms / 1000)
    try:
        _, key = server.new_key(rate_limit=10**9)
        api = (f"{server.url}/v1/chat/completions", {"Authorization": f"Bearer {key}"})
        direct = (f"{server.model.url}/chat/completions", {})
        print(f"api bench: gunicorn {args.workers} workers x {args.threads} threads, SQLite, "
              f"fake model server (+{args.model_delay_ms:.0f} ms), {mp.cpu_count()} cores, "
              f"{args.requests} requests per cell")
        print(f"{'clients':>7} | {'':6} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} | "
              f"{'stream/s':>8} {'ttft50':>7} {'ttft99':>7}")
        for level in LEVELS:
            for label, (url, headers) in (("api", api), ("direct", direct)):
                plain = load(url, headers, args.requests, level, stream=False)
                streamed = load(url, headers, args.requests, level, stream=True)
                errors = plain["errors"] + streamed["errors"]
                print(f"{level:>7} | {label:6} {plain['rate']:7.0f} {plain['p50']:7.1f} "
                      f"{plain['p99']:7.1f} | {streamed['rate']:8.0f} {streamed['ttft50']:7.1f} "
                      f"{streamed['ttft99']:7.1f}" + (f"   errors: {errors}" if errors else ""))
        print("api - direct = the gateway's cost per request (key, rate limit, budget, usage row, "
              "audit event, SSE re-framing)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
