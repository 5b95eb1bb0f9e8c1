"""Command line: ``python -m app.cli <command>`` or ``flask --app app.web.factory <command>``.

- ``migrate``: bring the schema to the newest revision;
- ``keys rotate``: re-encrypt every sealed column with the primary key (audited);
- ``audit verify`` / ``audit purge`` / ``audit checkpoint``: check the hash chain, drop events
  past the retention, seal a checkpoint now;
- ``audit export --out FILE`` / ``audit verify-export FILE [--public-key PEM]`` /
  ``audit public-key``: the Ed25519-signed compliance zip, checked with the public key alone;
- ``prices set`` / ``prices list``: the versioned price table;
- ``budgets set`` / ``budgets list``: budgets per scope and period;
- ``users create NAME --role admin|finance|auditor`` / ``users list`` / ``users unlock``.
- ``apikeys create`` / ``apikeys list`` / ``apikeys disable``: keys of the ``/v1`` API.
- ``kb add FILE --title T [--departments 1,2] [--contact TEAM]`` / ``kb list`` / ``kb remove ID`` /
  ``kb search QUESTION [--department N]`` / ``kb reindex``: the knowledge base.
- ``siem status`` / ``siem export``: the SIEM sinks' cursors, one export run now (app/siem).
- ``tools add|list|remove|allow|revoke|public-key``: MCP tool servers (app/tools, docs/tools.md).
- ``wecom-roles set --user ID|--department ID --role R`` / ``list`` / ``remove``: who may sign
  in to the admin site with WeCom (app/sso).
"""

from __future__ import annotations

import sys
from datetime import datetime

import click

from app.config import ConfigError
from app.siem.cli import siem_group
from app.sso.cli import wecom_roles_group
from app.tools.cli import tools_group


@click.group()
def cli() -> None:
    """WeCom bot administration."""


@cli.command()
@click.option("--database-url", envvar="DATABASE_URL", default=None, help="defaults to the settings'")
def migrate(database_url: str | None) -> None:
    """Bring the database schema to the newest revision."""
    from app import migrate as migrations

    if database_url is None:
        from app.config import Settings

        database_url = Settings.model_fields["database_url"].default
    before = migrations.current_revision(database_url)
    migrations.upgrade(database_url)
    after = migrations.current_revision(database_url)
    if before != after:
        click.echo(f"database upgraded from revision {before or '(empty)'} to {after}")
    click.echo(f"database is at the newest revision ({after})")


def _services():
    """The Flask app's services under ``flask``, else built from the environment."""
    from flask import current_app, has_app_context
    from flask.cli import ScriptInfo

    if has_app_context():
        return current_app.extensions["services"]
    context = click.get_current_context(silent=True)
    info = context.find_object(ScriptInfo) if context else None
    if info is not None:  # under ``flask --app app.web.factory``
        return info.load_app().extensions["services"]
    from app.config import get_settings
    from app.services import Services

    return Services(get_settings())


# -- keys ------------------------------------------------------------------------------------------
@click.group()
def keys() -> None:
    """Field-encryption keys (DATA_KEYS) and blind-index keys (BLIND_INDEX_KEY)."""


@keys.command()
@click.option("--batch-size", default=500, show_default=True, type=click.IntRange(1, 100_000))
def rotate(batch_size: int) -> None:
    """Re-encrypt rows written with old key ids using the primary key (DATA_KEYS' first)."""
    from app.security.rotation import rotate_keys

    services = _services()
    counts = rotate_keys(services, batch_size)
    for column, count in sorted(counts.items()):
        click.echo(f"{column}: {count} re-encrypted")
    click.echo(f"all sealed columns now use key {services.cipher.primary_id!r}")


@keys.command("rotate-index")
@click.option("--batch-size", default=500, show_default=True, type=click.IntRange(1, 100_000))
def rotate_index(batch_size: int) -> None:
    """Re-compute every blind index and API-key digest under BLIND_INDEX_KEY's first key."""
    from app.security.index_rotation import rotate_index as run

    services = _services()
    counts = run(services, batch_size)
    for name, count in sorted(counts.items()):
        click.echo(f"{name}: {count}")
    left = counts.get("api_keys.unsealed_left", 0)
    if left:
        click.echo(f"{left} API key(s) made before migration 0009 and unused since: they stop "
                   "working when the older key goes (one use moves them; or re-issue them)", err=True)
    click.echo("every index that has its plaintext sealed now uses the first BLIND_INDEX_KEY; "
               "the older keys can be removed")


# -- audit -----------------------------------------------------------------------------------------
@click.group()
def audit() -> None:
    """The hash-chained audit log."""


@audit.command()
def verify() -> None:
    """Check the chain, its head and its sealed purge/rotation/checkpoint events; name every
    changed, deleted, inserted or reordered row and every other problem (exit 1)."""
    services = _services()
    report = services.audit.check(services.db)
    for issue in report.issues:
        click.echo(str(issue), err=True)
    span = f"seq {report.first_seq}..{report.last_seq}" if report.rows else "no events"
    if not report.ok:
        click.echo(f"audit chain BROKEN: {len(report.issues)} problem(s) in {report.rows} events", err=True)
        sys.exit(1)
    click.echo(f"audit chain ok: {report.rows} events ({span}, anchor seq {report.anchor_seq})")


@audit.command()
@click.option("--days", type=int, default=None, help="retention; default AUDIT_RETENTION_DAYS")
def purge(days: int | None) -> None:
    """Delete events older than the retention (never below 180 days), keeping an anchor."""
    from app.audit.chain import MIN_RETENTION_DAYS, ChainBroken

    services = _services()
    days = services.settings.audit_retention_days if days is None else days
    if days < MIN_RETENTION_DAYS:
        raise click.BadParameter(f"must be at least {MIN_RETENTION_DAYS}", param_hint="--days")
    try:
        removed = services.audit.purge(services.db, days)
    except ChainBroken as exc:
        click.echo(str(exc), err=True)
        sys.exit(1)
    click.echo(f"purged {removed} audit events older than {days} days")


def _export_time(value: str | None, tz, default, end: bool = False):
    """An ISO date (a whole company-local day; ``--until`` includes it) or date-time."""
    from datetime import date, timedelta

    if not value:
        return default
    try:
        if len(value) == 10:
            day = date.fromisoformat(value) + timedelta(days=1 if end else 0)
            return datetime(day.year, day.month, day.day, tzinfo=tz)
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO date or date-time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=tz)


@audit.command("export")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False, writable=True))
@click.option("--since", default=None, help="ISO date or date-time (default: the beginning)")
@click.option("--until", default=None, help="ISO date (inclusive) or date-time (default: now)")
@click.option("--type", "event_type", default=None, help="only this event type")
@click.option("--reason", required=True, help="why: recorded in the audit log and the manifest")
def export(out_path, since, until, event_type, reason) -> None:
    """Write a signed zip (audit.csv, audit.jsonl, manifest.json) of the events in a range."""
    from datetime import UTC

    from app.audit.chain import EventType
    from app.audit.signing import SigningKeyMissing, signing_key
    from app.db import utcnow
    from app.web.admin.audit_export import ExportQuery, count_rows, export_stream

    services = _services()
    if len(reason.strip()) < 10:
        raise click.BadParameter("give a real reason (at least 10 characters)", param_hint="--reason")
    try:
        signing_key(services.settings)
    except SigningKeyMissing as exc:
        raise click.ClickException(str(exc)) from None
    if event_type and event_type not in EventType.ALL:
        raise click.BadParameter(f"one of {', '.join(EventType.ALL)}", param_hint="--type")
    tz = services.settings.timezone
    query = ExportQuery(_export_time(since, tz, datetime(1970, 1, 1, tzinfo=UTC)),
                        _export_time(until, tz, utcnow(), end=True), event_type)
    services.audit.record(services.db, EventType.EXPORT, actor="cli", outcome="ok",
                          payload={"kind": "audit", "reason": reason, "out": out_path,
                                   **query.as_json()})
    total = count_rows(services.db, query)
    with open(out_path, "wb") as out, click.progressbar(length=total, label="exporting",
                                                         file=sys.stderr) as bar:
        for chunk in export_stream(services, query, reason=reason, exported_by="cli",
                                   progress=bar.update):
            out.write(chunk)
    click.echo(f"wrote {out_path}: {total} events")


@audit.command()
@click.option("--outage", default=None, help="why no event was written before this one: signs "
                                             "off the gap 'audit verify' reports (recorded)")
def checkpoint(outage: str | None) -> None:
    """Seal a checkpoint event now (the beat does every AUDIT_CHECKPOINT_MINUTES)."""
    services = _services()
    if outage is not None and len(outage.strip()) < 10:
        raise click.BadParameter("say what happened (at least 10 characters)", param_hint="--outage")
    seq = services.audit.checkpoint(services.db, outage=outage, actor="cli")
    click.echo(f"audit checkpoint sealed at seq {seq}")


@audit.command("public-key")
def public_key() -> None:
    """Print the PEM public key that verifies this server's exports (give it to auditors)."""
    from app.audit.signing import SigningKeyMissing, public_pem, signing_key

    try:
        click.echo(public_pem(signing_key(_services().settings)), nl=False)
    except SigningKeyMissing as exc:
        raise click.ClickException(str(exc)) from None


@audit.command("verify-export")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--public-key", "public_key_path", type=click.Path(exists=True, dir_okay=False),
              default=None, help="the signer's PEM public key (no server settings needed); "
                                 "default: this server's own")
def verify_export(path, public_key_path) -> None:
    """Check an export's signature, checksums, row counts and chain links (exit 1 if not)."""
    from app.web.admin.audit_export import verify_export as check

    if public_key_path is not None:
        with open(public_key_path, "rb") as pem:
            key = pem.read()
    else:
        from app.audit.signing import SigningKeyMissing, signing_key

        try:
            key = signing_key(_services().settings).public_key()
        except SigningKeyMissing as exc:
            raise click.ClickException(f"{exc}; or give --public-key") from None
    try:
        problems = check(path, key)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--public-key") from None
    for problem in problems:
        click.echo(problem, err=True)
    if problems:
        click.echo(f"export BROKEN: {len(problems)} problem(s)", err=True)
        sys.exit(1)
    click.echo("export ok: Ed25519 signature, checksums, row counts and links verify")


# -- prices ----------------------------------------------------------------------------------------
@click.group()
def prices() -> None:
    """The versioned model price table (per million tokens)."""


@prices.command("set")
@click.argument("model")
@click.option("--input", "input_per_m", required=True, help="price per million input tokens")
@click.option("--cached", "cached_per_m", default=None, help="per million cached input tokens")
@click.option("--output", "output_per_m", required=True, help="price per million output tokens")
@click.option("--currency", default=None)
@click.option("--valid-from", default=None, help="ISO time (default now)")
def set_price(model, input_per_m, cached_per_m, output_per_m, currency, valid_from) -> None:
    """Add a price version for MODEL ('*' = any model without its own price)."""
    from app.accounting import set_price as add_price

    services = _services()
    when = datetime.fromisoformat(valid_from) if valid_from else None
    with services.db.transaction() as session:
        price = add_price(session, model, input_per_m, cached_per_m or input_per_m, output_per_m,
                          currency or services.settings.currency, when)
    click.echo(f"{price.model}: from {price.valid_from.isoformat()} input {price.input_per_m} "
               f"cached {price.cached_input_per_m} output {price.output_per_m} {price.currency}/M")


@prices.command("list")
def list_prices() -> None:
    from sqlalchemy import select

    from app.models import ModelPrice

    with _services().db.session() as session:
        for p in session.scalars(select(ModelPrice).order_by(ModelPrice.model, ModelPrice.valid_from)):
            click.echo(f"{p.model}\t{p.valid_from.isoformat()}\t{p.input_per_m}\t"
                       f"{p.cached_input_per_m}\t{p.output_per_m}\t{p.currency}")


# -- budgets ---------------------------------------------------------------------------------------
@click.group()
def budgets() -> None:
    """Budgets per scope (global, department, user, api_key) and period."""


@budgets.command("set")
@click.argument("scope", type=click.Choice(["global", "department", "user", "api_key"]))
@click.argument("value", required=False, default="")
@click.option("--period", type=click.Choice(["day", "week", "month"]), default="month")
@click.option("--limit", "limit_amount", required=True)
@click.option("--action", type=click.Choice(["block", "warn"]), default="block")
@click.option("--thresholds", default=None, help="percentages, default BUDGET_THRESHOLDS")
def set_budget(scope, value, period, limit_amount, action, thresholds) -> None:
    """Create or change a budget; for 'user' VALUE is the WeCom user id (stored as its index)."""
    from app.accounting import set_budget as put_budget
    from app.audit.chain import EventType
    from app.outbox.rows import user_hash
    from app.wecom.departments import department_id

    services = _services()
    if scope == "user":
        value = user_hash(services.blind_index, value)
    try:
        if scope == "department":  # as usage rows name it: the WeCom id's digits
            value = str(department_id(value))
        with services.db.transaction() as session:
            budget = put_budget(session, scope, value, period, limit_amount, action,
                                thresholds or services.settings.budget_thresholds,
                                services.settings.currency)
            services.audit.append(session, EventType.ADMIN_CHANGE, actor="cli", outcome="ok",
                                  payload={"budget_id": budget.id, "scope": scope, "period": period,
                                           "limit": str(budget.limit), "action": action})
    except ValueError as exc:  # a department that is not an id, a limit that is not positive, ...
        raise click.BadParameter(str(exc)) from None
    click.echo(f"budget {budget.id}: {scope} {value[:12]} {period} {budget.limit} {action}")


@budgets.command("list")
def list_budgets() -> None:
    from sqlalchemy import select

    from app.models import Budget

    with _services().db.session() as session:
        for b in session.scalars(select(Budget).order_by(Budget.id)):
            click.echo(f"{b.id}\t{b.scope}\t{b.scope_value[:12]}\t{b.period}\t{b.limit}\t"
                       f"{b.action}\t{b.thresholds}\t{'on' if b.enabled else 'off'}")


# -- admin accounts --------------------------------------------------------------------------------
@click.group()
def users() -> None:
    """Local accounts of the admin area (roles: admin, finance, auditor)."""


@users.command("create")
@click.argument("name")
@click.option("--role", type=click.Choice(["admin", "finance", "auditor"]), required=True)
@click.password_option("--password", prompt="Password", help="prompted for (hidden) if not given")
def create_user(name: str, role: str, password: str) -> None:
    """Create an admin account NAME with a role; the password is argon2-hashed."""
    from app.audit.chain import EventType
    from app.web.admin.accounts import create_user as add_user

    services = _services()
    try:
        with services.db.transaction() as session:
            user = add_user(session, name, role, password)
            services.audit.append(session, EventType.ADMIN_CHANGE, actor="cli", outcome="ok",
                                  payload={"action": "user_create", "user": name, "role": role})
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"user {user.name} ({user.role}) created")


@users.command("list")
def list_users() -> None:
    from sqlalchemy import select

    from app.models import AdminUser

    with _services().db.session() as session:
        for u in session.scalars(select(AdminUser).order_by(AdminUser.name)):
            locked = u.locked_until.isoformat() if u.locked_until else "-"
            click.echo(f"{u.name}\t{u.role}\t{'on' if u.enabled else 'off'}\tlocked until {locked}")


@users.command("unlock")
@click.argument("name")
def unlock_user(name: str) -> None:
    """Clear the failed-login lockout of NAME."""
    from sqlalchemy import update

    from app.audit.chain import EventType
    from app.models import AdminUser

    services = _services()
    with services.db.transaction() as session:
        changed = session.execute(update(AdminUser).where(AdminUser.name == name)
                                  .values(failed_attempts=0, locked_until=None)).rowcount
        if changed:
            services.audit.append(session, EventType.ADMIN_CHANGE, actor="cli", outcome="ok",
                                  payload={"action": "user_unlock", "user": name})
    if not changed:
        raise click.ClickException(f"no user {name!r}")
    click.echo(f"user {name} unlocked")


# -- API keys --------------------------------------------------------------------------------------
@click.group()
def apikeys() -> None:
    """Keys of internal applications for the OpenAI-compatible /v1 API."""


@apikeys.command("create")
@click.argument("name")
@click.option("--rate-limit", default=60, show_default=True, type=click.IntRange(1, 1_000_000),
              help="requests per minute")
def create_apikey(name: str, rate_limit: int) -> None:
    """Create a key for application NAME and print it (once: only its hash is kept)."""
    from app.audit.chain import EventType
    from app.web.api.keys import create_key

    services = _services()
    try:
        with services.db.transaction() as session:
            row, key = create_key(session, services.blind_index, name, rate_limit,
                                  cipher=services.cipher)
            services.audit.append(session, EventType.ADMIN_CHANGE, actor="cli", outcome="ok",
                                  payload={"api_key": row.name, "action": "create",
                                           "prefix": row.prefix, "rate_limit_per_min": rate_limit})
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    click.echo(key)
    click.echo(f"api key {row.name!r} ({row.prefix}...), {rate_limit}/min: store it now, "
               "it is not shown again", err=True)


@apikeys.command("list")
def list_apikeys() -> None:
    from app.web.api.keys import list_keys

    with _services().db.session() as session:
        for k in list_keys(session):
            used = k.last_used_at.isoformat() if k.last_used_at else "never"
            click.echo(f"{k.name}\t{k.prefix}...\t{'on' if k.enabled else 'off'}\t"
                       f"{k.rate_limit_per_min}/min\t{k.created_at.isoformat()}\t{used}")


@apikeys.command("disable")
@click.argument("name")
def disable_apikey(name: str) -> None:
    """Refuse every further request made with NAME's key."""
    from app.audit.chain import EventType
    from app.web.api.keys import disable_key

    services = _services()
    try:
        with services.db.transaction() as session:
            disable_key(session, name)
            services.audit.append(session, EventType.ADMIN_CHANGE, actor="cli", outcome="ok",
                                  payload={"api_key": name, "action": "disable"})
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    click.echo(f"api key {name!r} disabled")


# -- knowledge base --------------------------------------------------------------------------------
@click.group()
def kb() -> None:
    """The knowledge base: documents the bot answers from (README "Knowledge base")."""


def _departments_option(value: str | None) -> list[int]:
    from app.knowledge.parsing import UploadError
    from app.knowledge.store import parse_departments

    try:
        return parse_departments(value)
    except UploadError as exc:
        raise click.BadParameter(str(exc), param_hint="--departments") from None


@kb.command("add")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--title", required=True, help="shown in the answers' sources; a document with "
                                               "this title is replaced")
@click.option("--departments", default=None, help="WeCom department ids, e.g. 1,2 (default: everyone)")
@click.option("--id", "document_id", type=int, default=None, help="replace this document")
@click.option("--contact", default=None,
              help="the team a 'not found' names for this document's topics, where its sections do not "
                   "name one (e.g. '财务部 分机 8300')")
@click.option("--without-vectors", is_flag=True,
              help="add it although the other documents have vectors and no EMBEDDINGS_BASE_URL is set")
def kb_add(path: str, title: str, departments: str | None, document_id: int | None,
           contact: str | None, without_vectors: bool) -> None:
    """Add (or replace) a Markdown, text, HTML, PDF or DOCX document."""
    from pathlib import Path

    from app.knowledge.parsing import UploadError
    from app.knowledge.store import KnowledgeStore

    services = _services()
    store = KnowledgeStore(services)
    file = Path(path)
    if file.stat().st_size > services.settings.kb_max_upload_bytes:
        raise click.ClickException(f"{file.name}: the file is over the "
                                   f"{services.settings.kb_max_upload_bytes} byte limit")
    if not without_vectors and store.vectors_missing_here():
        raise click.ClickException(
            "the knowledge base's documents have vectors but EMBEDDINGS_BASE_URL is not set here, so this "
            "one would have none: load the settings the stack runs with first (make run: set -a; "
            ". var/stack.env; set +a; docs/retrieval.md), or pass --without-vectors")
    try:
        result = store.add(file.read_bytes(), title, filename=file.name,
                           departments=_departments_option(departments), document_id=document_id,
                           contact=contact)
    except UploadError as exc:
        raise click.ClickException(f"{file.name}: {exc}") from None
    click.echo(f"document {result.document_id} {result.status}: {result.chunks} chunks "
               f"({result.doc_type})")


@kb.command("list")
def kb_list() -> None:
    """Documents: id, title, type, chunks, size, visibility, version, updated."""
    from app.knowledge.store import KnowledgeStore

    for d in KnowledgeStore(_services()).list():
        seen_by = "everyone" if not d.departments else "departments " + ",".join(map(str, d.departments))
        click.echo(f"{d.id}\t{d.title}\t{d.doc_type}\t{d.chunks} chunks\t{d.size_bytes} bytes\t"
                   f"{seen_by}\tv{d.version}\t{d.updated_at.isoformat(timespec='seconds')}")


@kb.command("remove")
@click.argument("document_id", type=int)
def kb_remove(document_id: int) -> None:
    """Delete a document with its chunks and index entries."""
    from app.knowledge.store import KnowledgeStore

    if not KnowledgeStore(_services()).remove(document_id):
        raise click.ClickException(f"no document {document_id}")
    click.echo(f"document {document_id} removed")


@kb.command("reindex")
def kb_reindex() -> None:
    """Chunk and index every document again (after KB_CHUNK_TOKENS or BLIND_INDEX_KEY changed)."""
    from app.knowledge.store import KnowledgeStore

    click.echo(f"{KnowledgeStore(_services()).reindex()} documents re-indexed")


@kb.command("search")
@click.argument("question")
@click.option("--department", "departments", type=click.IntRange(1, 2**32 - 1), multiple=True,
              help="search as a member of this department (repeatable); default: public documents")
@click.option("--all", "everything", is_flag=True, help="every document, whatever its visibility")
@click.option("--previous", default=None, help="the previous question, for a follow-up")
@click.option("--top", type=click.IntRange(1, 50), default=5, show_default=True)
def kb_search(question: str, departments: tuple[int, ...], everything: bool,
              previous: str | None, top: int) -> None:
    """Print the ranked passages for QUESTION with their scores."""
    from app.knowledge.retrieval import EVERYTHING, Retriever, relevance_rule

    services = _services()
    result = Retriever(services).search(question, EVERYTHING if everything else list(departments),
                                        previous=previous, top_k=top)
    if result.query != question:
        click.echo(f"searched with the previous question: {result.query!r}")
    for rank, p in enumerate(result.candidates, 1):
        mark = "" if p in result.passages else "  (not relevant)"
        cosine = "" if p.similarity is None else f" cosine {p.similarity:.2f}"
        reranked = "" if p.relevance is None else f" relevance {p.relevance:.2f}"
        click.echo(f"#{rank} bm25 {p.score:.2f} coverage {p.coverage:.2f}{cosine}{reranked}{mark}  "
                   f"[{p.document_id}] {p.source}")
        click.echo("    " + p.text.replace("\n", "\n    "))
    if not result.found:
        click.echo(f"nothing relevant (no passage reaches {relevance_rule(services.settings, result)}): "
                   "the bot would say it could not find it")


for _group in (keys, audit, prices, budgets, users, apikeys, kb):
    cli.add_command(_group)
cli.add_command(siem_group(_services))
cli.add_command(tools_group(_services))
cli.add_command(wecom_roles_group(_services))


def main() -> None:
    try:
        cli()
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
