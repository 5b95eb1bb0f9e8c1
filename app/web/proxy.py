"""Trusting a reverse proxy's ``X-Forwarded-*`` headers, and only as many hops as configured.

Behind nginx every request comes from nginx's address; the audit fingerprints and the admin
login need the client's, and URL building needs the original scheme and host. Believing these
headers without a proxy in front would let any client forge them, hence the default of 0 (off).
The proxy must set (not pass through) each header trusted here: see docker/nginx/.
"""

from __future__ import annotations

from flask import Flask
from werkzeug.middleware.proxy_fix import ProxyFix


def trust_proxies(app: Flask, count: int) -> None:
    """Wrap the WSGI app in ``ProxyFix`` for ``count`` proxies (X-Forwarded-For/-Proto/-Host/-Port)."""
    if count < 0:
        raise ValueError("count must be >= 0")
    if count:
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=count, x_proto=count, x_host=count,
                                x_port=count, x_prefix=0)
