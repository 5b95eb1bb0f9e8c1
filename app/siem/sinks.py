"""What the two sinks share: the error that means "not received" and the TLS context (the sinks
the settings name are built in ``app.siem.configured``, which imports both sinks: this module
imports neither)."""

from __future__ import annotations

import ssl


class SinkError(Exception):
    """The receiver did not take the batch: the cursor stays, the batch is sent again next run.
    ``permanent``: retrying as is will not help (a refused certificate, a 4xx from the
    collector): the operator has to act; the message says what, never what was sent."""

    def __init__(self, reason: str, cause: BaseException | str | None = None, *, permanent: bool = False):
        detail = cause if isinstance(cause, str) else (type(cause).__name__ if cause else "")
        if isinstance(cause, BaseException) and str(cause):
            detail = f"{type(cause).__name__}: {str(cause)[:120]}"
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.permanent = permanent


def tls_context(ca_file: str | None, cert_file: str | None, key_file: str | None) -> ssl.SSLContext:
    """Verify the receiver against ``ca_file`` (else the system's CAs), TLS 1.2 at least; present
    ``cert_file`` (and ``key_file``) when the receiver asks for a client certificate."""
    context = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file:
        context.load_cert_chain(cert_file, key_file)
    return context
