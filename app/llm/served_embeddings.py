"""The engine's embeddings server for one run of the knowledge base's evaluation (``demo.eval``,
the embedder's training): the core reaches ``inference`` through ``app.llm`` only."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def served_embeddings(directory: str | Path) -> Iterator[dict]:
    """The embedder in ``directory`` served over HTTP for the block, as the settings (lower-case
    ``Settings`` fields) that point the knowledge base at it."""
    from inference.server.embeddings import served_settings  # the engine only when asked for

    with served_settings(directory) as settings:
        yield settings
