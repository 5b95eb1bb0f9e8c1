"""gunicorn settings for the web service (read from the working directory by gunicorn).

The callback does little CPU work and waits on the database and Redis, so a few processes with
threads each keep the acknowledgement fast on two cores. Everything can be overridden through
the environment (or ``GUNICORN_CMD_ARGS``).
"""

import multiprocessing
import os

bind = os.environ.get("WEB_BIND", "127.0.0.1:8080")
workers = int(os.environ.get("WEB_WORKERS", min(2 * multiprocessing.cpu_count() + 1, 9)))
# gthread whose event loop reads each request whole before a thread sees it (as nginx does):
# slow uploads cost a socket and a buffer, never one of the threads, so they cannot starve
# /healthz or the callbacks, behind nginx or without it; past REQUEST_BODY_TIMEOUT_S they get
# 408 (app/web/gunicorn_worker.py). Plain gthread gave each trickling client a thread (about 72
# held them all); more threads only move that line, and gevent would need the database and
# Redis drivers patched.
worker_class = "app.web.gunicorn_worker.BufferingThreadWorker"
threads = int(os.environ.get("WEB_THREADS", 8))
timeout = int(os.environ.get("WEB_TIMEOUT", 60))
# A streamed /v1 answer may still be running at shutdown: it gets this long to finish.
graceful_timeout = int(os.environ.get("WEB_GRACEFUL_TIMEOUT", 30))
# Must exceed the proxy's upstream keepalive_timeout (4 s in docker/nginx/), so that nginx never
# reuses a connection that gunicorn is closing.
keepalive = int(os.environ.get("WEB_KEEPALIVE", 5))
max_requests = int(os.environ.get("WEB_MAX_REQUESTS", 0))
max_requests_jitter = 100
accesslog = os.environ.get("WEB_ACCESS_LOG") or None
errorlog = "-"
loglevel = os.environ.get("WEB_LOG_LEVEL", "info")
# No preload: each worker opens its own database and Redis connections after the fork.
preload_app = False

# -- Prometheus multiprocess mode (app/web/metrics_view.py, docs/observability.md) ---------------------
# Each worker writes its counters to files in this directory and /metrics adds them up. It must be
# set before a worker creates a metric, so it is set here, in the master, if the operator did not;
# a fresh private directory by default, emptied at start (old files would count twice), and a dead
# worker's live gauges are dropped when it exits.
import shutil  # noqa: E402
import tempfile  # noqa: E402

_own_metrics_dir = "PROMETHEUS_MULTIPROC_DIR" not in os.environ
if _own_metrics_dir:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="wecom-bot-metrics-")


# -- The intake server (app/web/intake_server.py) ---------------------------------------------------
# One process writes every web process's callbacks (larger batches, and no request thread holds
# the GIL that a transaction waits for). gunicorn runs it as its one "dirty worker": started
# with the service, started again if it dies, stopped with it. The web processes find it at
# INTAKE_SOCKET (a private directory by default) and write in-process while it cannot be
# reached. INTAKE_SERVER=0 leaves it out: each web process then writes its own callbacks.
_own_intake_dir = None
if os.environ.get("INTAKE_SERVER", "1") != "0":
    if not os.environ.get("INTAKE_SOCKET"):
        _own_intake_dir = tempfile.mkdtemp(prefix="wecom-bot-intake-")
        os.environ["INTAKE_SOCKET"] = os.path.join(_own_intake_dir, "intake.sock")
    dirty_apps = ["app.web.intake_server:IntakeApp"]
    dirty_workers = 1
    # gunicorn keys its dirty processes' pid file by this name and kills an "orphan" it finds
    # there at start: one name per address keeps two services on one host apart.
    proc_name = f"wecom-bot-{bind}"
else:
    os.environ.pop("INTAKE_SOCKET", None)


def on_starting(server):
    directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        if name.endswith(".db"):
            os.remove(os.path.join(directory, name))


def post_worker_init(worker):
    # A request thread that waited (for the intake server, the database, Redis) needs the GIL
    # back while its neighbours run; with Python's 5 ms interval each such wait could cost up to
    # 5 ms more, and under load a web process fell into a state where most of its threads sat
    # in those waits with the cores half idle (bench.callback: ~1,400/s instead of ~2,500/s).
    import sys

    sys.setswitchinterval(float(os.environ.get("WEB_GIL_SWITCH_MS", "0.5")) / 1000)


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    if _own_metrics_dir:
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
    if _own_intake_dir:
        shutil.rmtree(_own_intake_dir, ignore_errors=True)
