"""Relevance from a reranking model over ``/rerank`` in the Jina / Cohere format (vLLM,
Xinference, LocalAI and the hosted reranking APIs serve it), e.g. bge-reranker-v2-m3.

Why: BM25's coverage and an embedding's cosine say how much a passage is *about* the question;
whether it *answers* it is what decides between an answer and "not found", and the two part
exactly where an employee asks near a topic ("今天食堂中午吃什么" over the canteen's opening hours).
A cross-encoder reads question and passage together and judges that much better; when one is
configured (``RERANK_BASE_URL``), its score alone orders the fused candidates and decides which
are relevant (``KB_MIN_RELEVANCE``). When it fails, the thresholds decide as without it (logged).

Request: ``{"model", "query", "documents": [...], "top_n", "return_documents": false}``;
answer: ``{"results": [{"index", "relevance_score"}, ...]}`` (a bare list, and ``score`` for
``relevance_score``, as Text Embeddings Inference writes them, are read too).
"""

from __future__ import annotations

import math

import requests

from app.http.session import session_for


class RerankError(RuntimeError):
    """The reranking server did not answer usefully."""


class RerankClient:
    def __init__(self, base_url: str, model: str, api_key: str = "", timeout_s: float = 10.0,
                 session: requests.Session | None = None):
        self.url = base_url.rstrip("/") + "/rerank"
        self.model = model
        self.timeout_s = timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.session = session or session_for(self.url)

    def scores(self, query: str, documents: list[str]) -> list[float]:
        """One relevance score per document, in the documents' order."""
        if not documents:
            return []
        body = {"model": self.model, "query": query, "documents": documents, "top_n": len(documents),
                "return_documents": False}
        try:
            resp = self.session.post(self.url, json=body, headers=self.headers, timeout=self.timeout_s)
            resp.raise_for_status()
            answer = resp.json()
        except (requests.RequestException, ValueError) as exc:
            raise RerankError(f"rerank server: {type(exc).__name__}") from None
        results = answer.get("results") if isinstance(answer, dict) else answer
        if not isinstance(results, list):
            raise RerankError("rerank server: no results")
        found: dict[int, float] = {}
        for item in results:
            index, score = _index_and_score(item)
            if not 0 <= index < len(documents) or index in found:
                raise RerankError("rerank server: an index out of range or repeated")
            found[index] = score
        if len(found) != len(documents):
            raise RerankError(f"rerank server: scored {len(found)} of {len(documents)} documents")
        return [found[i] for i in range(len(documents))]


def _index_and_score(item) -> tuple[int, float]:
    try:
        index = item["index"]
        score = item["relevance_score"] if "relevance_score" in item else item["score"]
    except (KeyError, TypeError):
        raise RerankError("rerank server: a result without index and score") from None
    if isinstance(index, bool) or not isinstance(index, int) or isinstance(score, bool) \
            or not isinstance(score, int | float) or not math.isfinite(score):
        raise RerankError("rerank server: a result without index and score")
    return index, float(score)


def client_from(settings) -> RerankClient | None:
    if not settings.rerank_base_url:
        return None
    return RerankClient(settings.rerank_base_url, settings.rerank_model,
                        settings.rerank_api_key.get_secret_value(), settings.rerank_timeout_s)
