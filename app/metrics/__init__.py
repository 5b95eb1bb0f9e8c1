"""The product's Prometheus metrics: ``counters`` (the names, counted as events happen) and
``collectors`` (values read at scrape time)."""
