"""OpenAI's ``POST /v1/embeddings`` over an ``inference.embedder.Embedder``: what ``python -m
inference serve --embeddings DIR`` adds to its routes, and what the knowledge base's
``EMBEDDINGS_BASE_URL`` client (``app/knowledge/embeddings.py``) calls.

The request: ``input`` (a string or a list of strings; token-id arrays are refused, this model
reads text), ``model`` (optional; when given, the embedder's name), ``encoding_format``
(``float``, or ``base64``: little-endian float32, as OpenAI sends it). ``usage`` counts n-grams
as this model's tokens. Bad requests get OpenAI's error shape with a 400.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np
from flask import Flask, jsonify, request
from pydantic import BaseModel, ConfigDict, Field
from werkzeug.serving import make_server

from inference.embedder import Embedder, ngrams
from inference.server.errors import error, register_http_errors, validation_detail

MAX_INPUTS = 2048  # OpenAI's own limit per request
MAX_INPUT_CHARS = 32_768
MAX_BODY_BYTES = 8 * 1024 * 1024


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: str | list[str] = Field(min_length=1)
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"

    def texts(self) -> list[str]:
        texts = [self.input] if isinstance(self.input, str) else self.input
        if len(texts) > MAX_INPUTS:
            raise ValueError(f"input: at most {MAX_INPUTS} texts a request")
        if any(len(t) > MAX_INPUT_CHARS for t in texts):
            raise ValueError(f"input: a text is over {MAX_INPUT_CHARS} characters")
        return texts


def register(app: Flask, embedder: Embedder, name: str) -> None:
    """Add ``POST /v1/embeddings`` for ``embedder``, served as ``name``."""

    @app.post("/v1/embeddings")
    def embeddings():
        try:
            body = json.loads(request.get_data(cache=False) or b"null")
            parsed = EmbeddingsRequest.model_validate(body)
            texts = parsed.texts()
        except (ValueError, RecursionError) as exc:
            message = validation_detail(exc) or (str(exc) if "input:" in str(exc) else "")
            return error(400, message or "the body is not a valid embeddings request")
        if parsed.model not in (None, name):
            return error(404, f"the model {parsed.model!r} does not exist here (it embeds with {name!r})",
                         code="model_not_found")
        vectors = embedder.embed(texts).numpy().astype(np.float32)
        data = []
        for index, vector in enumerate(vectors):
            value = (base64.b64encode(vector.astype("<f4").tobytes()).decode()
                     if parsed.encoding_format == "base64" else vector.tolist())
            data.append({"object": "embedding", "index": index, "embedding": value})
        tokens = sum(len(ngrams(t, embedder.config)) for t in texts)
        return jsonify({"object": "list", "data": data, "model": name,
                        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def embeddings_app(embedder: Embedder, name: str) -> Flask:
    """A server of embeddings alone (the evaluation's, and a test's)."""
    app = Flask(__name__)
    register(app, embedder, name)
    register_http_errors(app, MAX_BODY_BYTES)
    return app


@contextlib.contextmanager
def serving(directory: str | Path) -> Iterator[tuple[str, Embedder]]:
    """The embedder of ``directory`` served on a free local port in a thread, for as long as the
    block runs: (its /v1 base URL, the embedder). What the evaluation's knowledge base calls, so
    its vectors come over the same HTTP API the worker's do."""
    embedder = Embedder.load(directory)
    server = make_server("127.0.0.1", 0, embeddings_app(embedder, Path(directory).name), threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="embeddings-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1", embedder
    finally:
        server.shutdown()
        thread.join()


@contextlib.contextmanager
def served_settings(directory: str | Path) -> Iterator[dict]:
    """``serving(directory)``, as the settings that point the knowledge base at it (lower-case
    ``Settings`` fields): its URL and name, and the thresholds its training chose."""
    with serving(directory) as (url, embedder):
        yield {"embeddings_base_url": url, "embeddings_model": Path(directory).name,
               **embedder.config.chosen_settings()}

