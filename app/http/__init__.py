"""HTTP clients for one service each: ``pool`` (urllib3, the worker's hot calls) and ``session``
(requests)."""
