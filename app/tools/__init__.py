"""Tools the bot calls for the employee who asks (docs/tools.md): MCP servers an admin
registers (``registry``: the ``tool_servers`` table, the per-department allow-lists and the
side-effect flags), the SDK's client calls (``mcp_calls``), the tool lists cached and filtered
for an asker (``catalog``), and the asker's identity as a signed token a tool server verifies
(``identity``). The worker's side (the loop, the confirmations, the record) is
``worker.tools``; the CLI's ``tools`` commands are ``cli``."""
