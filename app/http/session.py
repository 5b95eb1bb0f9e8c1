"""A ``requests.Session`` for one service, with what requests reads from the environment read once.

A plain session (``trust_env``) looks up the proxy variables, ``NO_PROXY``, the CA bundle
variables and ``~/.netrc`` again on every request: about a twentieth of the worker's CPU per
message went to it (two calls a message: the model and WeCom's message/send). The environment
does not change while a process runs, so the same settings are read here once, for the service's
base URL, and the session stops reading them (``trust_env = False``): same proxies, same
``NO_PROXY`` bypass, same CA bundle, same ``.netrc`` credentials, for requests to that service.

Its connection pool keeps up to ``POOL_CONNECTIONS`` idle connections to the service, not
requests' 10: the worker's threads share one session, and with more threads than that it
closed a connection after most bursts ("Connection pool is full, discarding connection", ~100
times in 2,355 messages of ``bench.load`` at 16 threads) to open a new one for the next call.
"""

from __future__ import annotations

import os

import requests
from requests.adapters import HTTPAdapter
from requests.utils import get_environ_proxies, get_netrc_auth

POOL_CONNECTIONS = 64  # the worker's threads (docker-compose's WORKER_CONCURRENCY default)


def session_for(base_url: str) -> requests.Session:
    session = requests.Session()
    for scheme in ("http://", "https://"):
        session.mount(scheme, HTTPAdapter(pool_maxsize=POOL_CONNECTIONS))
    session.proxies.update(get_environ_proxies(base_url))  # {} when NO_PROXY covers the host
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle:
        session.verify = bundle
    auth = get_netrc_auth(base_url)
    if auth:
        session.auth = auth
    session.trust_env = False
    return session
