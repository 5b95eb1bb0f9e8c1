"""A ``requests.Session`` for one service, with what requests reads from the environment read once.

A plain session (``trust_env``) looks up the proxy variables, ``NO_PROXY``, the CA bundle
variables and ``~/.netrc`` again on every request: about a twentieth of the worker's CPU per
message went to it (two calls a message: the model and WeCom's message/send). The environment
does not change while a process runs, so the same settings are read here once, for the service's
base URL, and the session stops reading them (``trust_env = False``): same proxies, same
``NO_PROXY`` bypass, same CA bundle, same ``.netrc`` credentials, for requests to that service.
"""

from __future__ import annotations

import os

import requests
from requests.utils import get_environ_proxies, get_netrc_auth


def session_for(base_url: str) -> requests.Session:
    session = requests.Session()
    session.proxies.update(get_environ_proxies(base_url))  # {} when NO_PROXY covers the host
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle:
        session.verify = bundle
    auth = get_netrc_auth(base_url)
    if auth:
        session.auth = auth
    session.trust_env = False
    return session
