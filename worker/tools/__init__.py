"""The worker's side of tools (docs/tools.md): the bounded loop that lets the model call the
asker's tools (``loop``), the confirmation before a side effect (``confirm``), the record of each
call (``record``) and the demo's keyword router (``intent``). The calls themselves and the
cached tool lists are ``app.tools``."""
