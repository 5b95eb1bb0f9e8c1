"""Dense vectors from an OpenAI-compatible ``/v1/embeddings`` server, and exact search over them.

Optional: on when ``EMBEDDINGS_BASE_URL`` is set. Each chunk's vector (unit length, float32) is
sealed like its text (a vector can be decoded back into an approximation of the text, so it is
no less sensitive), and ``VectorIndex`` keeps the decrypted vectors of every chunk in memory,
one matrix per process, reloaded when a document changes (the documents' ids and versions are
its key). Search is exact: one matrix product over the rows of the visible documents only,
masked before ranking like the BM25 side. 10k chunks of 1024 dimensions are 40 MB and a few
milliseconds a question; pgvector would take over past that (not needed at handbook sizes).
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import requests
from sqlalchemy import select

from app.models import KnowledgeChunk, KnowledgeDocument

log = logging.getLogger(__name__)
BATCH = 64


class EmbeddingError(RuntimeError):
    """The embeddings server did not answer usefully."""


class EmbeddingClient:
    def __init__(self, base_url: str, model: str, api_key: str = "", timeout_s: float = 30.0,
                 session: requests.Session | None = None):
        self.url = base_url.rstrip("/") + "/embeddings"
        self.model = model
        self.timeout_s = timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.session = session or requests.Session()

    def embed(self, texts: list[str]) -> list[np.ndarray]:
        """Unit-length float32 vectors, one per text, in order."""
        out: list[np.ndarray] = []
        for start in range(0, len(texts), BATCH):
            batch = texts[start:start + BATCH]
            try:
                resp = self.session.post(self.url, json={"model": self.model, "input": batch},
                                         headers=self.headers, timeout=self.timeout_s)
                resp.raise_for_status()
                data = sorted(resp.json()["data"], key=lambda d: d["index"])
            except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
                raise EmbeddingError(f"embeddings server: {type(exc).__name__}") from None
            if len(data) != len(batch):
                raise EmbeddingError("embeddings server answered a different number of vectors")
            for item in data:
                vector = np.asarray(item["embedding"], dtype=np.float32)
                norm = float(np.linalg.norm(vector))
                out.append(vector / norm if norm else vector)
        return out


def client_from(settings) -> EmbeddingClient | None:
    if not settings.embeddings_base_url:
        return None
    return EmbeddingClient(settings.embeddings_base_url, settings.embeddings_model,
                           settings.embeddings_api_key.get_secret_value(),
                           settings.embeddings_timeout_s)


def seal_vector(cipher, vector: np.ndarray, chunk_id: int) -> str:
    return cipher.encrypt(vector.astype(np.float32).tobytes(), "kb_chunks", "vector_enc", chunk_id)


class VectorIndex:
    """Every chunk's vector, decrypted once per process and document version."""

    def __init__(self, services):
        self.services = services
        self._lock = threading.Lock()
        self._key: tuple | None = None
        self._ids = np.zeros(0, dtype=np.int64)
        self._docs = np.zeros(0, dtype=np.int64)
        self._matrix = np.zeros((0, 0), dtype=np.float32)

    def _current_key(self, session) -> tuple:
        return tuple(session.execute(select(KnowledgeDocument.id, KnowledgeDocument.version)
                                     .order_by(KnowledgeDocument.id)).all())

    def _load(self, session) -> None:
        key = self._current_key(session)
        if key == self._key:
            return
        cipher = self.services.cipher
        ids, docs, vectors = [], [], []
        for chunk_id, document_id, sealed in session.execute(
                select(KnowledgeChunk.id, KnowledgeChunk.document_id, KnowledgeChunk.vector_enc)
                .where(KnowledgeChunk.vector_enc.is_not(None))):
            ids.append(chunk_id)
            docs.append(document_id)
            vectors.append(np.frombuffer(cipher.decrypt_bytes(sealed, "kb_chunks", "vector_enc",
                                                              chunk_id), dtype=np.float32))
        dims = {v.shape[0] for v in vectors}
        if len(dims) > 1:
            log.warning("chunk vectors of different sizes %s: re-index (kb reindex)", sorted(dims))
            keep = max(dims, key=lambda d: sum(v.shape[0] == d for v in vectors))
            picked = [i for i, v in enumerate(vectors) if v.shape[0] == keep]
            ids, docs, vectors = ([ids[i] for i in picked], [docs[i] for i in picked],
                                  [vectors[i] for i in picked])
        self._ids = np.asarray(ids, dtype=np.int64)
        self._docs = np.asarray(docs, dtype=np.int64)
        self._matrix = np.vstack(vectors) if vectors else np.zeros((0, 0), dtype=np.float32)
        self._key = key

    def search(self, session, query: np.ndarray, visible_ids: set[int], limit: int
               ) -> list[tuple[int, float]]:
        """(chunk id, cosine) of the best visible chunks, best first."""
        with self._lock:
            self._load(session)
            ids, docs, matrix = self._ids, self._docs, self._matrix
        if not len(ids) or matrix.shape[1] != query.shape[0]:
            return []
        mask = np.isin(docs, np.fromiter(visible_ids, dtype=np.int64, count=len(visible_ids)))
        if not mask.any():
            return []
        rows = np.flatnonzero(mask)
        sims = matrix[rows] @ query
        order = np.argsort(-sims)[:limit]
        return [(int(ids[rows[i]]), float(sims[i])) for i in order]
