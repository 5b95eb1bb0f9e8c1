"""Tools the bot calls for the employee who asks (docs/tools.md): MCP servers an admin
registers (``registry``: the ``tool_servers`` table, the per-department allow-lists and the
side-effect flags, the cached tool lists), and the asker's identity as a signed token a tool
server verifies (``identity``). The worker's side (the loop, the calls, the confirmations) is
``worker.tools``."""
