"""The web tier: the Flask app (``factory.create_app``), its blueprints (the WeCom and AI bot
callbacks, ``/v1``, the admin area, probes, ``/metrics``), gunicorn's worker and intake
server, and the AI bot's long connection. It imports the core (``app``); the core and the
worker never import it, so the worker's process runs without Flask."""
