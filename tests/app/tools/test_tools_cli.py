"""``tools add | list | allow | revoke | remove | public-key`` on both databases, with the demo
MCP server as a real process: registration refused when bad, secrets sealed, the tool list
asked of the server and cached, the policies shown."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from app.services import Services
from app.tools import registry
from app.tools.cli import tools_group
from app.tools.models import ToolServer
from tests.support import mcp_servers
from tests.support.env import settings_from


@pytest.fixture
def setup(env, db, redis_client, tmp_path):
    seed, pem = mcp_servers.keypair(tmp_path)
    port = mcp_servers.free_port()
    process = mcp_servers.start(["-m", "emulator.mcp_server", "--port", str(port), "--public-key", str(pem)], port)
    services = Services(settings_from(env, tools_signing_key=seed), db)
    yield services, f"http://127.0.0.1:{port}/mcp", pem
    mcp_servers.stop(process)


def test_register_allow_list_revoke_remove(setup):
    services, url, pem = setup
    runner = CliRunner()
    group = tools_group(lambda: services)
    assert runner.invoke(group, ["add", "Bad Name", url]).exit_code == 2
    assert runner.invoke(group, ["add", "demo", "ftp://nowhere"]).exit_code == 2
    added = runner.invoke(group, ["add", "demo", url, "--secret", "X-Api-Key=gw-secret-123456789"])
    assert added.exit_code == 0, added.output
    assert runner.invoke(group, ["add", "demo", url]).exit_code == 2  # taken
    with services.db.session() as session:
        row = session.scalars(select(ToolServer)).one()
        assert "gw-secret" not in row.secrets_enc and row.target == url
    assert runner.invoke(group, ["allow", "demo", "leave_balance", "--departments", "2,3"]).exit_code == 0
    assert runner.invoke(group, ["allow", "demo", "book_meeting_room", "--departments", "all"]).exit_code == 0
    assert runner.invoke(group, ["allow", "demo", "x", "--departments", "two"]).exit_code == 2
    assert runner.invoke(group, ["allow", "nope", "x", "--departments", "all"]).exit_code == 2
    out = runner.invoke(group, ["list", "--refresh"]).output
    assert f"demo [http] {url}" in out
    assert "leave_balance: departments 2,3; reads" in out
    assert "book_meeting_room: everyone; acts (asks first)" in out
    assert "expense_claim_status: not allowed; reads" in out
    assert services.redis.get(f"tools:list:{registry.server(services, 'demo').version}") is not None
    assert runner.invoke(group, ["revoke", "demo", "leave_balance"]).exit_code == 0
    assert "leave_balance: not allowed" in runner.invoke(group, ["list"]).output
    assert runner.invoke(group, ["public-key"]).output == pem.read_text()
    assert runner.invoke(group, ["remove", "demo"]).exit_code == 0
    assert registry.servers(services) == [] and registry.policies(services) == {}
    assert runner.invoke(group, ["remove", "demo"]).exit_code == 1


def test_keys_rotate_reseals_a_servers_secrets(env, db, redis_client):
    import base64
    import os

    from app.audit.chain import EventType
    from app.security.rotation import rotate_keys

    services = Services(settings_from(env), db)
    services.audit.record(db, EventType.ADMIN_CHANGE, actor="test", payload={})  # a sealed chain head
    registry.add_server(services, "hr", "http", "http://127.0.0.1:9/mcp", {"X-Api-Key": "gw-0123456789"})
    new_keys = "k9:" + base64.b64encode(os.urandom(32)).decode() + "," + env["DATA_KEYS"]
    rotated = Services(settings_from(env, data_keys=new_keys), db)
    assert rotate_keys(rotated)["tool_servers.secrets_enc"] == 1
    only_new = Services(settings_from(env, data_keys=new_keys.split(",")[0]), db)
    assert registry.server(only_new, "hr").secrets == {"X-Api-Key": "gw-0123456789"}
