"""What the knowledge base keeps for the life of a process, built once by ``Services``
(``services.knowledge_caches``) and shared by every ``KnowledgeStore`` and ``Retriever`` of it:

- ``term_hashers``: one keyed term hasher per key of the blind-index ring (their words' caches
  grow as documents and questions are read);
- ``vector_index``: every chunk's vector, decrypted once per document version;
- ``breaker``: the embeddings and reranking servers that just failed, left alone a while.
"""

from __future__ import annotations

from functools import cached_property

from app.knowledge.breaker import Breaker
from app.knowledge.embeddings import VectorIndex
from app.knowledge.terms import TermHasher


def ring_term_hashers(blind_index) -> list[TermHasher]:
    """The term hashers, one per key of the blind-index ring (current first), each keyed by a
    key derived from that blind-index key (its own domain). Documents are indexed with the
    first; retrieval asks for all, so a new current BLIND_INDEX_KEY keeps older documents
    findable until ``kb reindex`` moves them."""
    under = getattr(blind_index, "under", None)
    count = getattr(blind_index, "key_count", 1) if under else 1
    return [TermHasher(bytes.fromhex(under(i, "kb-term-key", "v1") if under
                                     else blind_index("kb-term-key", "v1"))) for i in range(count)]


class KnowledgeCaches:
    def __init__(self, services):
        self._services = services
        self.breaker = Breaker()

    @cached_property
    def term_hashers(self) -> list[TermHasher]:
        return ring_term_hashers(self._services.blind_index)

    @property
    def term_hasher(self) -> TermHasher:
        """The hasher documents are indexed with: the current key's."""
        return self.term_hashers[0]

    @cached_property
    def vector_index(self) -> VectorIndex:
        return VectorIndex(self._services)
