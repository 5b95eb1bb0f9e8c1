"""Load: N simulated employees chat through the WeCom emulator for a while, on this machine.

Starts the whole stack (tests/support/stack.py: gunicorn, a Celery worker and beat, PostgreSQL,
Redis DB 3, the in-process emulator with an address book of N employees, the fake model server).
Each employee is a thread that sends a message, waits a random think time (mean ``--interval``
seconds) and sends the next. The emulator measures each callback's acknowledgement (its first
delivery attempt: POST to gunicorn's empty 200); the database gives each message's time to the
answer. Every few seconds the resident memory of gunicorn (all its processes) and the worker is
sampled; a straight-line fit over the second half of the run says whether it still grows.

    python -m bench.load [--users 200] [--duration 300] [--interval 10] [--model-delay-ms 200]

Prints: messages sent, answered (each exactly once), acknowledgement p50/p99/max, answer p50/p99,
and for web and worker the RSS at start, at the end and its trend (MB per minute) with a verdict.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from app.wecom.emulator.directory import Directory
from tests.support.stack import Stack, wait_for

REDIS_DB = 3
SAMPLE_EVERY_S = 5.0
GROWTH_LIMIT_MB_PER_MIN = 1.0


def employees(n: int) -> Directory:
    departments = [{"id": 1, "name": "公司", "parentid": 0, "order": 1}]
    users = [{"userid": f"emp{i:04d}", "name": f"员工{i}", "department": [1], "main_department": 1,
              "status": 1, "enable": 1} for i in range(n)]
    return Directory(departments, users)


def rss_mb(root_pid: int) -> float:
    """Resident memory of a process and its children (gunicorn's master and workers), in MB."""
    total = 0
    pids = [root_pid]
    for pid in pids:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                pids.extend(int(c) for c in f.read().split())
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total / 1024


def slope_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope (MB per minute) of (seconds, MB) samples."""
    if len(samples) < 3:
        return 0.0
    xs, ys = [s[0] / 60 for s in samples], [s[1] for s in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Employee(threading.Thread):
    def __init__(self, stack: Stack, userid: str, interval: float, until: float, acks: list, lock):
        super().__init__(daemon=True)
        self.stack, self.userid, self.interval, self.until = stack, userid, interval, until
        self.acks, self.lock = acks, lock
        self.sent = 0
        self.errors = 0

    def run(self) -> None:
        rng = random.Random(self.userid)
        time.sleep(rng.uniform(0, self.interval))  # spread the first messages
        while time.monotonic() < self.until:
            try:
                answer = self.stack.send(self.userid, f"{self.userid} 第{self.sent}个问题", wait=True)
                first = answer.get("first_attempt") or {}
                with self.lock:
                    if first.get("status_code") == 200:
                        self.acks.append(first["latency_ms"])
                    else:
                        self.errors += 1
                self.sent += 1
            except Exception:  # noqa: BLE001 - counted, the run goes on
                self.errors += 1
            time.sleep(rng.expovariate(1 / self.interval))


def answer_latencies(db_url: str) -> tuple[dict[str, int], list[float]]:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            counts = dict(conn.execute(text("SELECT status, count(*) FROM inbound_messages GROUP BY status")).all())
            rows = conn.execute(text("SELECT created_at, answered_at FROM inbound_messages "
                                     "WHERE answered_at IS NOT NULL")).all()
    finally:
        engine.dispose()
    return counts, [(a - c).total_seconds() * 1000 for c, a in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of sending")
    parser.add_argument("--interval", type=float, default=10.0, help="mean think time per employee (s)")
    parser.add_argument("--model-delay-ms", type=float, default=200.0)
    parser.add_argument("--worker-concurrency", type=int, default=16)
    parser.add_argument("--web-workers", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    stack = Stack(tmp, db_kind="postgres", redis_db=REDIS_DB, model_delay_s=args.model_delay_ms / 1000,
                  worker_concurrency=args.worker_concurrency, directory=employees(args.users),
                  extra_env={"WEB_WORKERS": str(args.web_workers), "WEB_THREADS": "16",
                             "SWEEP_INTERVAL_S": "10", "SWEEP_QUEUED_AFTER_S": "30",
                             "CLAIM_LEASE_S": "30"})
    stack.emulator.state.config.max_items = 10**6
    print(f"starting the stack in {tmp} ...", flush=True)
    stack.start()
    try:
        run(stack, args)
    finally:
        stack.stop()


def run(stack: Stack, args) -> None:
    users = [u["userid"] for u in stack.emulator.state.directory.users]
    acks: list[float] = []
    lock = threading.Lock()
    started = time.monotonic()
    until = started + args.duration
    crowd = [Employee(stack, u, args.interval, until, acks, lock) for u in users]
    for employee in crowd:
        employee.start()
    samples: dict[str, list[tuple[float, float]]] = {"web": [], "worker": []}
    while time.monotonic() < until:
        now = time.monotonic() - started
        for name in samples:
            samples[name].append((now, rss_mb(stack.procs[name].pid)))
        time.sleep(SAMPLE_EVERY_S)
    for employee in crowd:
        employee.join(timeout=30)
    sent = sum(e.sent for e in crowd)
    errors = sum(e.errors for e in crowd)
    print(f"sent {sent} messages in {args.duration:.0f}s; waiting for the answers ...", flush=True)

    def delivered() -> int:
        return stack.emu("GET", "stats")["apis"].get("message/send", {}).get("delivered", 0)

    try:
        wait_for(lambda: delivered() >= sent, timeout=300, interval=1.0, what="every answer")
    except AssertionError as exc:
        print(f"WARNING: {exc}")
    time.sleep(2)
    counts, answer_ms = answer_latencies(stack.db.url)
    per_user = {}
    for message in stack.emu("GET", "messages", params={"limit": 10**7})["messages"]:
        per_user.setdefault(message["touser"], []).append(message["content"])
    duplicates = sum(len(v) - len(set(v)) for v in per_user.values())
    report(args, sent, errors, delivered(), duplicates, counts, acks, answer_ms, samples)


def report(args, sent, errors, delivered, duplicates, counts, acks, answer_ms, samples) -> None:
    ok = True
    print()
    print(f"load: {args.users} employees, {args.duration:.0f}s, think time ~{args.interval:.0f}s, "
          f"model {args.model_delay_ms:.0f} ms, {os.cpu_count()} CPUs (shared: figures are noisy)")
    print(f"  messages sent {sent} ({sent / args.duration:.1f}/s), send errors {errors}, "
          f"rows {dict(sorted(counts.items()))}")
    all_answered = delivered == sent and counts.get("answered", 0) == sent and duplicates == 0
    ok &= all_answered
    print(f"  answers delivered {delivered}, duplicates {duplicates}: "
          f"{'all answered exactly once' if all_answered else 'NOT all answered once'}")
    p99 = pct(acks, 0.99)
    ok &= p99 < 100
    print(f"  ack (callback 200) ms: p50 {pct(acks, 0.5):.1f}  p99 {p99:.1f}  max {max(acks, default=0):.1f}"
          f"  -> p99 {'<' if p99 < 100 else '>='} 100 ms")
    print(f"  answer ms (accepted -> answered): p50 {pct(answer_ms, 0.5):.0f}  p99 {pct(answer_ms, 0.99):.0f}")
    for name, points in samples.items():
        if not points:
            continue
        half = points[len(points) // 2:]
        trend = slope_per_min(half)
        stable = trend < GROWTH_LIMIT_MB_PER_MIN
        ok &= stable
        print(f"  {name} RSS MB: start {points[0][1]:.0f}  end {points[-1][1]:.0f}  max "
              f"{max(p[1] for p in points):.0f}  trend (2nd half) {trend:+.2f} MB/min "
              f"-> {'stable' if stable else 'GROWING'}")
    print(f"  verdict: {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
