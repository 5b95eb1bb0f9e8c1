"""What the worker tells the outside about itself.

- ``signals``: the Celery signal handlers (our JSON logs with the request id, the metrics
  endpoint started in the worker process);
- ``metrics``: the worker's own Prometheus endpoint and its scrape-time collectors (the
  message counters themselves are ``app.metrics.counters``');
- ``heartbeat``: the thread that keeps the worker and beat marked alive in Redis (``/readyz``
  reads the keys through ``app.heartbeats``), and the containers' health check command.

The modules here import nothing of the message path but ``worker.runtime`` (what the
collectors read), so observing never loads the worker twice over.
"""
