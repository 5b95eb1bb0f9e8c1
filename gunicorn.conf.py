"""gunicorn settings for the web service (read from the working directory by gunicorn).

The callback does little CPU work and waits on the database and Redis, so a few processes with
threads each keep the acknowledgement fast on two cores. Everything can be overridden through
the environment (or ``GUNICORN_CMD_ARGS``).
"""

import multiprocessing
import os

bind = os.environ.get("WEB_BIND", "127.0.0.1:8080")
workers = int(os.environ.get("WEB_WORKERS", min(2 * multiprocessing.cpu_count() + 1, 9)))
worker_class = "gthread"
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
