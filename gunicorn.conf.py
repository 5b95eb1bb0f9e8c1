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
graceful_timeout = 30
keepalive = 5
max_requests = int(os.environ.get("WEB_MAX_REQUESTS", 0))
max_requests_jitter = 100
accesslog = os.environ.get("WEB_ACCESS_LOG") or None
errorlog = "-"
loglevel = os.environ.get("WEB_LOG_LEVEL", "info")
# No preload: each worker opens its own database and Redis connections after the fork.
preload_app = False
