"""The tools an asker may be offered: every enabled server's tool list (cached in Redis for
``TOOLS_LIST_TTL_S``, the last good list kept a day for a server that is down, and a server whose
list failed not asked again for ``DOWN_S``, so no message waits for its timeout), filtered by the
policies for the asker's departments. A tool nobody allowed, or not allowed for any of the
asker's departments, never reaches the model.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass

from app.tools import mcp_calls, registry
from app.tools.mcp_calls import ListedTool, ToolFailure
from app.tools.registry import Server

log = logging.getLogger(__name__)
SEPARATOR = "__"  # the model sees server__tool: names stay unique across servers
STALE_S = 86_400
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's, as app.llm.tools checks it
MAX_TOOLS = 128  # OpenAI's limit on tools
DOWN_S = 30  # a server whose list failed is not asked again for this long


@dataclass(frozen=True)
class OfferedTool:
    server: Server
    tool: str
    description: str
    input_schema: dict
    side_effect: bool

    @property
    def function(self) -> str:
        return f"{self.server.name}{SEPARATOR}{self.tool}"[:64]

    def openai(self) -> dict:
        return {"type": "function", "function": {"name": self.function, "description": self.description,
                                                 "parameters": self.input_schema}}


class Catalog:
    def __init__(self, services):
        self.services = services
        self.settings = services.settings

    def listed(self, server: Server) -> list[ListedTool]:
        """The server's tools: from the cache, else asked (and cached), else the last good list."""
        fresh, stale = f"tools:list:{server.version}", f"tools:list:stale:{server.version}"
        redis = self.services.redis
        try:
            cached = redis.get(fresh)
            if cached is not None:
                return [ListedTool(**t) for t in json.loads(cached)]
        except Exception:  # noqa: BLE001 - without Redis, ask the server
            log.warning("tool list cache unavailable")
        down = f"tools:list:down:{server.version}"
        try:
            if redis.get(down) is None:
                tools = mcp_calls.list_tools(server, self.settings.tools_call_timeout_s)
            else:  # it failed a moment ago: no message waits for its timeout again
                raise ToolFailure("unavailable", "listed as down")
        except ToolFailure as exc:
            log.warning("tool list of server %s unavailable: %s", server.name, exc.kind)
            try:
                redis.set(down, exc.kind, ex=DOWN_S, nx=True)
                cached = redis.get(stale)
                return [ListedTool(**t) for t in json.loads(cached)] if cached else []
            except Exception:  # noqa: BLE001
                return []
        try:
            encoded = json.dumps([t.as_dict() for t in tools])
            redis.set(fresh, encoded, ex=self.settings.tools_list_ttl_s)
            redis.set(stale, encoded, ex=STALE_S)
        except Exception:  # noqa: BLE001 - asked again next time
            log.warning("tool list not cached server=%s", server.name)
        return tools

    def refresh(self, server: Server) -> list[ListedTool]:
        """Ask the server now (``tools list --refresh``)."""
        try:
            self.services.redis.delete(f"tools:list:{server.version}", f"tools:list:down:{server.version}")
        except Exception:  # noqa: BLE001
            log.warning("tool list cache unavailable")
        return self.listed(server)

    def offered(self, departments) -> list[OfferedTool]:
        policies = registry.policies(self.services)
        if not policies:
            return []
        offered = []
        for server in registry.servers(self.services, enabled_only=True):
            if not any(server_id == server.id for server_id, _ in policies):
                continue
            for tool in self.listed(server):
                policy = policies.get((server.id, tool.name))
                if policy is None or not policy.allows(departments):
                    continue
                side_effect = policy.side_effect if policy.side_effect is not None else not tool.read_only
                offered.append(OfferedTool(server, tool.name, tool.description, tool.input_schema,
                                           side_effect))
        return usable(offered)


def usable(offered: list[OfferedTool]) -> list[OfferedTool]:
    """The tools the model interface accepts: a server's tool whose name cannot be a function
    name (or collides with another's once prefixed and cut to 64), or whose schema is not an
    object, is left out and logged, never failing the asker's message; at most ``MAX_TOOLS``."""
    kept, seen = [], set()
    for tool in offered:
        if (not FUNCTION_NAME.match(tool.function) or tool.function in seen
                or not isinstance(tool.input_schema, dict) or len(kept) >= MAX_TOOLS):
            log.warning("tool left out (name, schema or count) server=%s", tool.server.name)
            continue
        seen.add(tool.function)
        kept.append(tool)
    return kept
