"""The worker's side of tools (docs/tools.md): the MCP calls (``mcp_calls``), the cached tool
lists filtered for the asker (``catalog``), the bounded loop that lets the model call them
(``loop``), the confirmation before a side effect (``confirm``), the record of each call
(``record``) and the demo's keyword router (``intent``)."""
