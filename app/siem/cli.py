"""``python -m app.cli siem status | export`` (also ``flask --app app.web.factory siem ...``)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click
from sqlalchemy import func, select

from app.models import UsageRecord


def siem_group(services: Callable) -> click.Group:
    """The ``siem`` commands over the services ``services()`` builds (app.cli's)."""

    @click.group("siem")
    def siem() -> None:
        """Audit events and spend streamed to the SIEM (docs/siem.md)."""

    @siem.command()
    def status() -> None:
        """Each sink's cursor, how far behind it is, and why its last run stopped."""
        from app.siem import cursors
        from app.siem.records import audit_head

        s = services()
        with s.db.reader() as session:
            heads = {"audit": audit_head(session),
                     "usage": int(session.scalar(select(func.coalesce(func.max(UsageRecord.id), 0))))}
        rows = cursors.all_cursors(s.db)
        if not rows:
            click.echo("no sink has run yet" + ("" if s.settings.siem_enabled else
                                                " (SIEM_SYSLOG_URL and SIEM_OTLP_URL are unset)"))
        for c in rows:
            behind = max(heads.get(c.stream, 0) - c.position, 0)
            policy = "" if c.stream != "audit" else (
                f" payload={'sealed' if not c.clear_fields else c.clear_fields}")
            click.echo(f"{c.sink}/{c.stream}: at {c.position}, {behind} behind, {c.exported} sent"
                       f"{policy}" + (f"; last run stopped: {c.last_error}" if c.last_error else ""))

    @siem.command("export")
    def export_now() -> None:
        """One export run now (the beat runs one every SIEM_INTERVAL_S); exit 1 if a sink failed."""
        from app.siem import export_once

        s = services()
        if not s.settings.siem_enabled:
            click.echo("no sink: set SIEM_SYSLOG_URL and/or SIEM_OTLP_URL", err=True)
            sys.exit(2)
        result = export_once(s)
        for key, stream in result.streams.items():
            click.echo(f"{key}: sent {stream.sent} in {stream.batches} batches, at {stream.position}"
                       + (f"; stopped: {stream.error}" if stream.error else ""))
        for sink in result.skipped:
            click.echo(f"{sink}: another run holds it; skipped")
        if any(stream.error for stream in result.streams.values()):
            sys.exit(1)

    return siem
