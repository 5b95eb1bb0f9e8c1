"""The tools area (admin only): the registered MCP servers, their tools and who may use each,
and each tool's calls, failures and latency from the audit log's ``tool_call`` events.

Registering, allowing, revoking and removing go through ``app.tools.registry`` (the CLI's own
calls); each is an ``admin_change`` audit event. A server's secrets are written, never shown.
"""

from __future__ import annotations

from collections import defaultdict

from flask import abort, flash, redirect, render_template, url_for
from flask_wtf import FlaskForm
from sqlalchemy import select
from wtforms import BooleanField, SelectField, StringField, TextAreaField
from wtforms.fields.choices import SelectChoice
from wtforms.validators import DataRequired, Length, Optional

from app.audit.chain import EventType
from app.models import AdminRole, AuditEvent
from app.tools import registry
from app.tools.registry import RegistryError
from app.web.admin import audit_admin, bp, roles_required, services

STATS_EVENTS = 2000  # the latest tool calls the page sums (their payloads are sealed: read here)
FAILED = ("error", "timeout", "unavailable", "malformed")


class ServerForm(FlaskForm):
    name = StringField("Name 名称 (the tools' prefix to the model, and the token's audience)",
                       validators=[DataRequired(), Length(max=31)])
    transport = SelectField("Transport 传输", choices=[SelectChoice("http", "streamable HTTP"),
                                                      SelectChoice("stdio", "stdio")])
    target = StringField("URL, or the stdio command line 地址或命令", validators=[DataRequired(), Length(max=1000)])
    secrets = TextAreaField("Its own credentials 凭据 (NAME=VALUE per line: headers or environment; stored sealed)",
                            validators=[Optional(), Length(max=4000)])


class AllowForm(FlaskForm):
    server = StringField("Server 服务", validators=[DataRequired(), Length(max=31)])
    tool = StringField("Tool 工具", validators=[DataRequired(), Length(max=128)])
    departments = StringField("Departments 部门 (1,2 or all)", validators=[DataRequired(), Length(max=1000)])
    side_effect = SelectField("Acts? 是否有副作用", choices=[SelectChoice("", "the tool's own hint"),
                                                       SelectChoice("1", "acts: ask first"),
                                                       SelectChoice("0", "only reads")])


class RevokeForm(FlaskForm):
    server = StringField(validators=[DataRequired()])
    tool = StringField(validators=[DataRequired()])
    everything = BooleanField()


def _secrets(text: str) -> dict:
    found = {}
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise RegistryError("credentials are NAME=VALUE, one a line")
        found[name.strip()] = value.strip()
    return found


def _departments(raw: str) -> list[int] | None:
    if raw.strip().lower() in ("*", "all", "everyone"):
        return None
    try:
        return [int(d) for d in raw.split(",") if d.strip()]
    except ValueError:
        raise RegistryError("departments: ids such as 1,2, or all") from None


def tool_stats(svc) -> dict[tuple[str, str], dict]:
    """(server, tool) -> calls, failures, mean latency (ms), over the latest tool_call events."""
    stats: dict = defaultdict(lambda: {"calls": 0, "failures": 0, "latency_ms": 0, "timed": 0})
    with svc.db.reader() as session:
        rows = session.scalars(select(AuditEvent).where(AuditEvent.event_type == EventType.TOOL_CALL)
                               .order_by(AuditEvent.seq.desc()).limit(STATS_EVENTS)).all()
        for row in rows:
            try:
                payload = svc.audit.payload_of(row)
            except Exception:  # noqa: BLE001, S112 - a row that does not decrypt is left out
                continue
            entry = stats[(payload.get("server", ""), payload.get("tool", ""))]
            if row.outcome in ("proposed", "cancelled", "refused"):
                continue
            entry["calls"] += 1
            entry["failures"] += row.outcome in FAILED
            if payload.get("latency_ms"):
                entry["latency_ms"] += int(payload["latency_ms"])
                entry["timed"] += 1
    return {k: {**v, "mean_ms": v["latency_ms"] // v["timed"] if v["timed"] else 0} for k, v in stats.items()}


def _page(server_form=None, allow_form=None, status: int = 200):
    svc = services()
    policies = registry.policies(svc)
    stats = tool_stats(svc)
    servers = []
    for server in registry.servers(svc):
        tools = []
        for (server_id, tool), policy in sorted(policies.items(), key=lambda item: item[0][1]):
            if server_id != server.id:
                continue
            tools.append({"name": tool, "departments": "everyone" if policy.departments is None
                          else ",".join(map(str, sorted(policy.departments))),
                          "side_effect": policy.side_effect,
                          **stats.get((server.name, tool), {"calls": 0, "failures": 0, "mean_ms": 0})})
        servers.append({"name": server.name, "transport": server.transport, "target": server.target,
                        "secrets": sorted(server.secrets), "tools": tools})
    return render_template("admin/tools.html", servers=servers, server_form=server_form or ServerForm(),
                           allow_form=allow_form or AllowForm(), enabled=svc.settings.tools_enabled), status


def _changed(action: str, **payload) -> None:
    with services().db.transaction() as session:
        audit_admin(session, EventType.ADMIN_CHANGE, payload={"action": action, **payload})


@bp.get("/tools")
@roles_required(AdminRole.ADMIN)
def tools():
    return _page()


@bp.post("/tools/servers")
@roles_required(AdminRole.ADMIN)
def tools_add_server():
    form = ServerForm()
    if not form.validate_on_submit():
        return _page(server_form=form, status=400)
    try:
        secrets = _secrets(form.secrets.data)
        registry.add_server(services(), form.name.data.strip(), form.transport.data, form.target.data.strip(), secrets)
    except RegistryError as exc:
        form.form_errors.append(str(exc))
        return _page(server_form=form, status=400)
    _changed("tools_server_added", server=form.name.data.strip(), transport=form.transport.data,
             secret_names=sorted(secrets))
    flash(f"Server {form.name.data.strip()} registered. 已登记。")
    return redirect(url_for("admin.tools"))


@bp.post("/tools/allow")
@roles_required(AdminRole.ADMIN)
def tools_allow():
    form = AllowForm()
    if not form.validate_on_submit():
        return _page(allow_form=form, status=400)
    side_effect = {"": None, "1": True, "0": False}[form.side_effect.data or ""]
    try:
        registry.allow(services(), form.server.data.strip(), form.tool.data.strip(),
                       _departments(form.departments.data), side_effect)
    except RegistryError as exc:
        form.form_errors.append(str(exc))
        return _page(allow_form=form, status=400)
    _changed("tools_allowed", server=form.server.data.strip(), tool=form.tool.data.strip(),
             departments=form.departments.data.strip(), side_effect=side_effect)
    flash(f"{form.server.data}.{form.tool.data} allowed. 已授权。")
    return redirect(url_for("admin.tools"))


@bp.post("/tools/revoke")
@roles_required(AdminRole.ADMIN)
def tools_revoke():
    form = RevokeForm()
    if not form.validate_on_submit():
        abort(400)
    server, tool = form.server.data.strip(), form.tool.data.strip()
    if form.everything.data:
        if not registry.remove_server(services(), server):
            abort(404)
        _changed("tools_server_removed", server=server)
        flash(f"Server {server} removed. 已移除。")
    else:
        if not registry.revoke(services(), server, tool):
            abort(404)
        _changed("tools_revoked", server=server, tool=tool)
        flash(f"{server}.{tool} revoked. 已撤销。")
    return redirect(url_for("admin.tools"))


