"""The core: what the web tier (``app.web``) and the worker (``worker``) both stand on.

Settings, storage, the outbox, accounting, the audit log, the knowledge base, WeCom's protocol and
client, and models through ``app.llm``. Nothing here imports Flask, werkzeug, gunicorn or
``app.web``: the worker's process loads none of them (``tests/test_dependencies.py``).
The Flask app is ``app.web.factory:create_app()``.
"""
