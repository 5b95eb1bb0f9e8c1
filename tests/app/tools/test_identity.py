"""The asker's identity token: what a tool server accepts and what it refuses."""

from __future__ import annotations

import os
import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.tools import identity
from app.tools.identity import IdentityError

KEY = Ed25519PrivateKey.from_private_bytes(os.urandom(32))
PUBLIC = identity.public_key_from_text(identity.public_pem(KEY))


def token(**overrides):
    values = {"issuer": "wecom-bot", "audience": "hr", "user_id": "lina", "departments": [3]}
    values.update(overrides)
    return identity.issue(KEY, **values)


def test_a_fresh_token_names_its_bearer_and_departments():
    asker = identity.verify(token(), PUBLIC, issuer="wecom-bot", audience="hr")
    assert (asker.user_id, asker.departments) == ("lina", (3,)) and len(asker.jti) == 32
    claims = jwt.decode(token(), options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == 60 and claims["aud"] == "hr"
    assert token() != token()  # a jti each: a server may refuse a replay


@pytest.mark.parametrize("bad, reason", [  # made when the test runs: a token lives 60 s
    (lambda: "", "no identity token"),
    (lambda: "a.b.c", "refused"),
    (lambda: token(audience="finance"), "another server"),
    (lambda: token(now=time.time() - 120), "expired"),
    (lambda: token(issuer="someone-else"), "refused"),
    (lambda: identity.issue(Ed25519PrivateKey.generate(), issuer="wecom-bot", audience="hr", user_id="lina",
                            departments=[3]), "refused"),  # signed by another key
    (lambda: jwt.encode({"iss": "wecom-bot", "aud": "hr", "sub": "lina", "exp": time.time() + 60,
                         "iat": time.time(), "jti": "x"}, "s" * 32, algorithm="HS256"), "refused"),  # alg swap
])
def test_what_a_server_refuses(bad, reason):
    with pytest.raises(IdentityError, match=reason):
        identity.verify(bad(), PUBLIC, issuer="wecom-bot", audience="hr")


def test_bearer_of():
    assert identity.bearer_of("Bearer abc") == "abc" and identity.bearer_of("Basic abc") == ""
    assert identity.bearer_of(None) == ""


def test_tools_on_without_a_key_stops_start_up():
    from app.config import ConfigError
    from tests.support.env import make_env, settings_from

    with pytest.raises(ConfigError, match="TOOLS_ENABLED needs TOOLS_SIGNING_KEY"):
        settings_from(make_env(), tools_enabled="true", tools_signing_key="")  # dev_env sets one
    with pytest.raises(ConfigError, match="TOOLS_SIGNING_KEY"):
        settings_from(make_env(), tools_enabled="true", tools_signing_key="too-short")


def test_a_tool_server_written_apart_reads_the_bots_tokens():
    """The demo server checks tokens with its own code (emulator/tool_identity.py), as a company's
    server would: what the bot issues, it accepts; another server's token or key, it refuses."""
    from emulator import tool_identity

    key = Ed25519PrivateKey.generate()
    public = tool_identity.load_public_key(identity.public_pem(key))
    token = identity.issue(key, issuer="wecom-bot", audience="demo", user_id="zhangwei", departments=[7])
    assert tool_identity.caller_of(token, public, issuer="wecom-bot", audience="demo") == \
        tool_identity.Caller("zhangwei", (7,))
    assert tool_identity.IDENTITY_META_KEY == identity.IDENTITY_META_KEY
    with pytest.raises(tool_identity.Refused, match="another server"):
        tool_identity.caller_of(token, public, issuer="wecom-bot", audience="payroll")
    other = tool_identity.load_public_key(identity.public_pem(Ed25519PrivateKey.generate()))
    with pytest.raises(tool_identity.Refused, match="InvalidSignature"):
        tool_identity.caller_of(token, other, issuer="wecom-bot", audience="demo")
