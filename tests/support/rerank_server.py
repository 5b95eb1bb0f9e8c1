"""A small reranking server in the Jina / Cohere format, checking what it receives.

``FakeRerankServer`` serves ``POST /v1/rerank``: the body must name the configured model and hold a
non-empty ``query``, a non-empty list of string ``documents`` and an integer ``top_n``, and, when
it has an ``api_key``, the request must carry it as a bearer token; anything else is a 400 naming
what was wrong (kept in ``problems``). It scores each document with ``judge(query, document)``
(the test's cross-encoder) and answers ``{"results": [{"index", "relevance_score"}]}``, best
first and cut to ``top_n``, as vLLM does; ``tei=True`` answers Text Embeddings Inference's bare
``[{"index", "score"}]`` instead. ``bodies`` keeps every request; ``answer`` (a function of the
request body), when set, replaces the answer (a broken server); ``fail_next`` answers 503.
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Flask, jsonify, request

from tests.support.media_servers import StandInServer


class FakeRerankServer(StandInServer):
    def __init__(self, judge: Callable[[str, str], float], model: str = "test-reranker",
                 api_key: str = "", tei: bool = False):
        self.judge, self.model, self.api_key, self.tei = judge, model, api_key, tei
        self.bodies: list[dict] = []
        self.answer: Callable[[dict], object] | None = None
        super().__init__()

    def _build(self) -> Flask:
        app = Flask("fake-rerank")

        @app.post("/v1/rerank")
        def rerank():
            body, failed = self._json_body()
            if failed is not None:
                return failed
            if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
                return self._refuse("no or wrong bearer token")
            if body.get("model") != self.model:
                return self._refuse(f"model {body.get('model')!r} is not {self.model!r}")
            query, documents, top_n = body.get("query"), body.get("documents"), body.get("top_n")
            if not isinstance(query, str) or not query.strip():
                return self._refuse("no query")
            if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
                return self._refuse("documents must be a non-empty list of strings")
            if not isinstance(top_n, int) or top_n < 1:
                return self._refuse("top_n must be a positive integer")
            if self.answer is not None:
                return jsonify(self.answer(body))
            scored = sorted(((self.judge(query, d), i) for i, d in enumerate(documents)), key=lambda s: -s[0])
            key = "score" if self.tei else "relevance_score"
            results = [{"index": i, key: score} for score, i in scored[:top_n]]
            return jsonify(results if self.tei else {"id": "rerank-1", "model": self.model, "results": results})

        return app
