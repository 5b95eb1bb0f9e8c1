"""Callback throughput, acknowledgement latency and CPU per callback through gunicorn.

Runs gunicorn with the real app (signature check, decrypt, parse, dedup, encrypted outbox row
written by the intake server, Celery publish) on this machine. Clients POST pre-built, correctly
signed and encrypted WeCom callbacks (each a distinct message) at 1, 16 and 64 concurrent
connections.

    python -m bench.callback [--db sqlite|postgres] [--seconds 5] [--client auto|wrk|python]

The load comes from ``wrk`` (Debian's ``wrk`` package; bench/callback_wrk.lua feeds it the
requests) when it is installed: a compiled client takes a small share of the two cores that the
server shares with it. Without it, a Python client (threads in 4 processes) is used, which takes
much more, and the rates are lower for it.

Prints, per level, callbacks/s, p50/p99 ack latency and the CPU milliseconds per accepted
callback (200) of the gunicorn processes: the master, the web workers and the intake server
(its dirty worker), user + system time from /proc over the level, the client's own CPU not
counted. The database server and Redis are not counted either. Target on 2 cores: p99 ack below
50 ms at 64 concurrent.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

import redis

from tests.support.callbacks import CallbackForger
from tests.support.stack import Stack, wait_for

LEVELS = (1, 16, 64)
WRK_SCRIPT = Path(__file__).with_name("callback_wrk.lua")
WRK_LINE = re.compile(r"WRK n=(\d+) us=(\d+) p50=(\d+) p99=(\d+) non2xx=(\d+) sockerr=(\d+)")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_tree(root_pid: int) -> list[int]:
    """A process and its descendants (children of any of their threads)."""
    pids = [root_pid]
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    pids.extend(int(c) for c in f.read().split())
            except OSError:
                continue
    return pids


def cpu_seconds(root_pid: int) -> dict[int, float]:
    """Per process of the tree: user + system CPU seconds, its reaped children's included (a
    worker gunicorn replaced is counted in its master)."""
    out = {}
    for pid in process_tree(root_pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[pid] = sum(int(v) for v in fields[11:15]) / CLOCK_TICKS  # utime stime cutime cstime
        except (OSError, IndexError, ValueError):
            continue
    return out


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds of the tree between two samples. The totals, not per process: a worker that
    ended in between moved its whole time into its parent's reaped-children time, and its time
    before the first sample is taken off with its own entry there."""
    return sum(after.values()) - sum(before.values())


def build_requests(env: dict, count: int, tag: str) -> list[tuple[str, bytes]]:
    forger = CallbackForger(env)
    out = []
    for i in range(count):
        params, body = forger.request(forger.message_xml(f"bench {tag} {i}", user=f"user{i % 200}",
                                                         msg_id=f"{tag}{i}"))
        out.append(("/wecom/callback?" + urlencode(params), body))
    return out


def _client(port: int, work: list[tuple[str, bytes]], threads: int, queue) -> None:
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()
    chunks = [work[i::threads] for i in range(threads)]

    def run(items):
        nonlocal errors
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        local = []
        for path, body in items:
            started = time.perf_counter()
            try:
                conn.request("POST", path, body=body, headers={"Content-Type": "text/xml"})
                resp = conn.getresponse()
                resp.read()
                ok = resp.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            local.append(time.perf_counter() - started)
            if not ok:
                with lock:
                    errors += 1
        with lock:
            latencies.extend(local)

    pool = [threading.Thread(target=run, args=(chunk,)) for chunk in chunks]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    queue.put((latencies, errors))


def load(port: int, work: list[tuple[str, bytes]], concurrency: int) -> dict:
    """``concurrency`` connections spread over up to 4 client processes (the GIL would cap one)."""
    procs_n = min(4, concurrency)
    per_proc = [work[i::procs_n] for i in range(procs_n)]
    threads = [concurrency // procs_n + (1 if i < concurrency % procs_n else 0) for i in range(procs_n)]
    queue = mp.Queue()
    procs = [mp.Process(target=_client, args=(port, items, t, queue)) for items, t in zip(per_proc, threads, strict=True)]
    started = time.perf_counter()
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    elapsed = time.perf_counter() - started
    for p in procs:
        p.join()
    latencies = sorted(x for lat, _ in results for x in lat)
    errors = sum(e for _, e in results)
    return {"rate": len(latencies) / elapsed, "p50": statistics.median(latencies) * 1000,
            "p99": latencies[int(len(latencies) * 0.99) - 1] * 1000, "errors": errors, "n": len(latencies)}


def load_wrk(port: int, work: list[tuple[str, bytes]], concurrency: int, seconds: float,
             tmp: Path) -> dict:
    """``concurrency`` connections from one wrk thread for ``seconds``, cycling through ``work``."""
    threads = 1 if concurrency < 32 else 2
    listing = tmp / f"requests-{port}-{concurrency}.txt"
    listing.write_bytes(b"".join(path.encode() + b"\t" + body + b"\n" for path, body in work))
    out = subprocess.run(
        ["wrk", "-t", str(threads), "-c", str(concurrency), "-d", f"{max(1, round(seconds))}s", "--timeout", "10s",
         "-s", str(WRK_SCRIPT), f"http://127.0.0.1:{port}", "--", str(listing), str(threads)],
        capture_output=True, text=True, check=True).stdout
    n, us, p50, p99, non2xx, sockerr = map(int, WRK_LINE.search(out).groups())
    return {"rate": n / (us / 1e6), "p50": p50 / 1000, "p99": p99 / 1000, "errors": non2xx + sockerr,
            "n": n, "wrapped": n > len(work)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--workers", type=int, default=min(2 * mp.cpu_count() + 1, 9),
                        help="gunicorn workers (gunicorn.conf.py's default)")
    parser.add_argument("--threads", type=int, default=None, help="gunicorn threads per worker")
    parser.add_argument("--client", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument("--seconds", type=int, default=5, help="per level and server (wrk)")
    parser.add_argument("--requests", type=int, default=3000,
                        help="per level (x3 for 64) with the python client; the most wrk expects per second")
    parser.add_argument("--redis-db", type=int, default=12, help="flushed at start and end")
    args = parser.parse_args()
    use_wrk = args.client == "wrk" or (args.client == "auto" and shutil.which("wrk") is not None)

    tmp = Path(tempfile.mkdtemp(prefix="bench-callback-"))
    stack = Stack(tmp, db_kind=args.db, redis_db=args.redis_db)
    stack.env["WEB_WORKERS"] = str(args.workers)
    if args.threads:
        stack.env["WEB_THREADS"] = str(args.threads)
    stack.emulator.start()
    stack.env["WECOM_API_BASE"] = stack.emulator.url
    from app import migrate

    migrate.upgrade(stack.db.url)
    stack.start_process("web", [sys.executable, "-m", "gunicorn", "app.web.factory:create_app()"])
    try:
        wait_for(stack._web_ready, 60, what="gunicorn (app)")
        master = stack.procs["web"].pid
        print(f"callback bench: db={args.db}, gunicorn {stack.env['WEB_WORKERS']} workers x "
              f"{stack.env['WEB_THREADS']} threads (+ the intake server), client "
              f"{'wrk' if use_wrk else 'python'}, on this machine ({mp.cpu_count()} cores)")
        print(f"{'clients':>7} | {'callbacks/s':>11} {'p50 ms':>7} {'p99 ms':>7} | {'accepted':>8} "
              f"{'gunicorn CPU ms/callback':>24}")
        for level in LEVELS:
            if use_wrk:
                n = int(args.requests * args.seconds * (1 if level > 1 else 0.3))
                requests = build_requests(stack.env, n, f"L{level}-")
                before = cpu_seconds(master)
                app = load_wrk(stack.web_port, requests, level, args.seconds, tmp)
                if app["wrapped"]:
                    print(f"  note: the app ran past {n} distinct callbacks (repeats are cheap "
                          f"duplicates); raise --requests")
            else:
                n = args.requests * (3 if level == 64 else 1) // (10 if level == 1 else 1)
                requests = build_requests(stack.env, n, f"L{level}-")
                before = cpu_seconds(master)
                app = load(stack.web_port, requests, level)
            used = cpu_used(before, cpu_seconds(master))
            accepted = app["n"] - app["errors"]
            cpu_ms = used * 1000 / accepted if accepted else float("nan")
            print(f"{level:>7} | {app['rate']:11.0f} {app['p50']:7.1f} {app['p99']:7.1f} | {accepted:8d} "
                  f"{cpu_ms:24.3f}" + (f"   errors: {app['errors']}" if app["errors"] else ""))
            redis.Redis.from_url(stack.redis_url).delete("chat")
        print("target: p99 ack < 50 ms at 64 clients")
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
