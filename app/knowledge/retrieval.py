"""BM25 over the documents an employee may see, and the decision "nothing relevant found".

Visibility is part of the SQL that reads the postings (``document_id IN (visible documents)``),
so a passage of another department is never scored, counted in a term's document frequency, or
even read: the collection statistics (N, average length) are those of the visible documents.

With an embeddings server (``EMBEDDINGS_BASE_URL``) the question's vector is compared with the
visible chunks' vectors too (``app.knowledge.embeddings``) and the two rankings are fused by
reciprocal rank.

Scoring is Okapi BM25 (k1 1.2, b 0.75) over the query's term hashes. Whether the best passage is
relevant at all is a separate, length-independent number, its *coverage*: the share of the
question's IDF weight that the passage matches, a term no visible passage holds weighing the
most (it is the specific thing asked about: "dog" in "can I bring my dog to the office?"). Below
``KB_MIN_SCORE`` the answer is "not found". Chinese character bigrams (``terms``) help ranking
but count half in coverage: a question's incidental pairs ("年能", "休几") would otherwise pull
good matches down.

With a reranking server (``RERANK_BASE_URL``, ``app.knowledge.rerank``) the best
``RERANK_CANDIDATES`` of that ranking go to it, and its scores alone order them and decide what
is relevant (``KB_MIN_RELEVANCE``); the thresholds above decide only when it fails.

A follow-up ("那北京呢？", "and in Beijing?"): a short question, or one that opens like a
follow-up, is searched together with the conversation's previous question.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from dataclasses import dataclass

from sqlalchemy import case, func, select

from app.knowledge.audience import Audience, documents_visible_to
from app.knowledge.embeddings import EmbeddingError, client_from
from app.knowledge.glossary import equivalents
from app.knowledge.rerank import RerankError
from app.knowledge.rerank import client_from as reranker_from
from app.knowledge.terms import CJK as CJK_CHAR
from app.knowledge.terms import terms
from app.metrics import counters as metrics
from app.models import (
    KnowledgeChunk,
    KnowledgeDocument,
    KnowledgePosting,
)

log = logging.getLogger(__name__)
K1, B = 1.2, 0.75
RRF_K = 60  # reciprocal rank fusion's constant (Cormack et al.)
BIGRAM_WEIGHT = 0.5
GLOSSARY_WEIGHT = 0.6  # an equivalent from the other language (app.knowledge.glossary)
EVERYTHING = None  # departments=EVERYTHING: no visibility filter (an admin's test box only)
FOLLOW_UP = re.compile(r"^\s*(那|那么|那如果|还有|另外|and\b|what about\b|how about\b|and in\b|what if\b)",
                       re.I)
SHORT_QUESTION_WORDS = 3
RANKED_FOR_OWN_WORDS = 20  # a follow-up's own ranking, checked for the passage found with the previous question
SKIPPED_WHAT = {"embeddings": "dense retrieval", "rerank": "reranking"}  # "... skipped" in the log


@dataclass
class Passage:
    chunk_id: int
    document_id: int
    title: str
    section: str
    text: str
    score: float  # BM25
    coverage: float  # 0..1, compared with KB_MIN_SCORE
    similarity: float | None = None  # cosine of the dense vectors, when they are on
    relevance: float | None = None  # the reranker's score, when one answered (KB_MIN_RELEVANCE)

    @property
    def source(self) -> str:
        return f"{self.title} › {self.section}" if self.section else self.title


@dataclass
class SearchResult:
    query: str
    passages: list[Passage]  # best first, every one relevant (over a threshold)
    candidates: list[Passage]  # best first, thresholds not applied (for the admin's test view)
    unknown: tuple[str, ...] = ()  # the question's words that no visible passage holds

    @property
    def found(self) -> bool:
        return bool(self.passages)


def relevance_rule(settings, result: SearchResult) -> str:
    """What a passage had to reach to be relevant in ``result``, in the settings' names."""
    if any(p.relevance is not None for p in result.candidates):
        return f"KB_MIN_RELEVANCE {settings.kb_min_relevance} (the reranker's score)"
    if any(p.similarity is not None for p in result.candidates):
        return f"KB_MIN_SCORE {settings.kb_min_score} or KB_MIN_SIMILARITY {settings.kb_min_similarity}"
    return f"KB_MIN_SCORE {settings.kb_min_score}"


def is_follow_up(question: str) -> bool:
    """Opens like a follow-up ("那…呢", "and in…", "what about…")."""
    return bool(FOLLOW_UP.match(question))


def names_a_topic(question: str) -> bool:
    """Has words enough of its own (two) to be searched alone, whatever it opens with."""
    return len([t for t in terms(question) if not t.startswith("~")]) >= 2


def is_short(question: str) -> bool:
    words = [t for t in terms(question) if not t.startswith("~")]
    return len(words) <= SHORT_QUESTION_WORDS and len(question) < 24


@dataclass(frozen=True)
class _Word:
    """A question's word for coverage, the bigrams that stand in for it when the documents cut
    it differently (a word: all of them; a lone character: any), and its alternatives, each
    all-or-nothing: its glossary equivalents, and the shorter words of the question it holds."""

    term: str
    weight: float
    bigrams: tuple[str, ...]
    alternatives: tuple[tuple[str, ...], ...] = ()


def _coverage_words(counts: Counter) -> list[_Word]:
    bigrams = [t[1:] for t in counts if t.startswith("~")]
    table = equivalents()
    cjk_words = [t for t in counts if not t.startswith("~") and len(t) > 1 and CJK_CHAR.match(t)]
    words = []
    for term in counts:
        if term.startswith("~"):
            continue
        if any(term != longer and term in longer for longer in cjk_words):
            # a piece jieba's search mode cut from a longer word of the question ("办公" of
            # "办公室"): part of that word, not a word of its own (else a compound counts two or
            # three times and "办公室可以抽烟吗" looks answered by any passage about the office)
            continue
        alternatives = tuple(table.get(term, ()))
        if CJK_CHAR.fullmatch(term):  # a lone character: weak evidence
            words.append(_Word(term, 0.5, tuple("~" + b for b in bigrams if term in b), alternatives))
        elif CJK_CHAR.match(term):
            pieces = tuple(piece for piece in cjk_words if piece != term and piece in term)
            words.append(_Word(term, 1.0, tuple("~" + term[i:i + 2] for i in range(len(term) - 1)),
                               alternatives + ((pieces,) if pieces else ())))
        else:
            words.append(_Word(term, 1.0, (), alternatives))
    return words


def _held(word: _Word, df: Counter) -> bool:
    """Whether some visible passage holds the word (itself, an equivalent, or its bigrams); a
    lone character says too little to count either way."""
    if word.weight < 1.0 or df.get(word.term):
        return True
    if any(all(df.get(t) for t in alt) for alt in word.alternatives):
        return True
    return bool(word.bigrams) and all(df.get(b) for b in word.bigrams)


def _coverage(words: list[_Word], idf: dict[str, float], matched: set[str]) -> float:
    """The share of the question's words (IDF-weighted) the passage holds, 0..1."""
    total = got = 0.0
    for word in words:
        weight = idf.get(word.term, 0.0) * word.weight
        total += weight
        if word.term in matched or any(all(t in matched for t in alt) for alt in word.alternatives):
            got += weight
        elif word.bigrams:
            lone = word.weight < 1.0
            if (any if lone else all)(b in matched for b in word.bigrams):
                got += weight
    return got / total if total else 0.0


def _visible_documents(departments):
    """The ids of the documents ``departments`` may see: an ``Audience`` (a group chat's members),
    one reader's department ids ([] = public documents only), or ``EVERYTHING``."""
    if departments is EVERYTHING:
        return select(KnowledgeDocument.id)
    audience = departments if isinstance(departments, Audience) else Audience.member(departments)
    return documents_visible_to(audience)


class Retriever:
    def __init__(self, services):
        self.services = services
        self.settings = services.settings
        self.cipher = services.cipher
        self.hashers = services.knowledge_caches.term_hashers
        self.embedder = client_from(self.settings)
        self.reranker = reranker_from(self.settings)
        self.vectors = services.knowledge_caches.vector_index
        self.breaker = services.knowledge_caches.breaker

    def search(self, question: str, departments: list[int] | Audience | None, *,
               previous: str | None = None, top_k: int | None = None,
               min_score: float | None = None) -> SearchResult:
        """The best passages visible to members of ``departments`` ([] = public documents only),
        or to every reader of an ``Audience`` (``app.knowledge.audience``).

        With ``previous`` (the conversation's previous question): a question that opens like a
        follow-up is searched together with it (alone when together finds nothing); a short one that finds nothing alone, too, unless
        it asks about something no visible document mentions ("Who is our CEO?" after a question
        about meals is a new topic: searched with it, it found the meal passage and was answered
        with it).
        """
        top_k = top_k or self.settings.kb_top_k
        threshold = self.settings.kb_min_score if min_score is None else min_score
        question = question.strip()
        previous = (previous or "").strip()
        combined = f"{previous}\n{question}" if previous else question
        if previous and is_follow_up(question):
            result = self._search(combined, departments, top_k, threshold)
            if not result.found:
                # a follow-up that names a topic of its own ("那班车呢？多久一班？" after the
                # lockers): the previous question's words only dilute it; alone, it may be found
                alone = self._search(question, departments, top_k, threshold)
                return alone if alone.found else result
            if not names_a_topic(question) or self._holds_own_words(question, result.passages[0], departments):
                return result
            alone = self._search(question, departments, top_k, threshold)
            if alone.found:
                # "那个密码锁定多久？" after the housing fund: together, the housing fund's passage
                # wins on the previous question's words; it holds none of this one's ("那晚饭呢？"
                # names too little to tell: the canteen's passage says "dinner")
                return alone
            return result
        result = self._search(question, departments, top_k, threshold)
        if previous and not result.found and is_short(question) and not result.unknown:
            return self._search(combined, departments, top_k, threshold)
        return result

    def _holds_own_words(self, question: str, passage: Passage, departments) -> bool:
        """Whether ``passage`` holds any of ``question``'s own words (among the passages the
        question alone ranks), not only the previous question's."""
        ranked = self._search(question, departments, RANKED_FOR_OWN_WORDS, 0.0).candidates
        return any(p.chunk_id == passage.chunk_id and p.coverage > 0 for p in ranked)

    def _search(self, query: str, departments, top_k: int, threshold: float) -> SearchResult:
        counts = Counter(terms(query))
        if not counts:
            return SearchResult(query, [], [])
        weights: dict[str, float] = {}  # term -> its weight in the BM25 sum
        for term in counts:
            weights[term] = BIGRAM_WEIGHT if term.startswith("~") else 1.0
        words = _coverage_words(counts)
        table = equivalents()
        for word in [t for t in counts if not t.startswith("~")]:  # a piece's equivalents rank too
            for alt in table.get(word, ()):
                for term in alt:
                    weights.setdefault(term, GLOSSARY_WEIGHT)
        # Each term's hash under every key of the blind-index ring (current first): documents
        # indexed before a new BLIND_INDEX_KEY are still found until ``kb reindex`` has run.
        term_of: dict[int, str] = {}
        for term in weights:
            for hasher in self.hashers:
                term_of.setdefault(hasher(term), term)
        visible = _visible_documents(departments)
        with self.services.db.reader() as session:
            stats = session.execute(
                select(KnowledgeDocument.chunk_count, KnowledgeDocument.term_total)
                .where(KnowledgeDocument.id.in_(visible))).all()
            n_chunks = sum(r.chunk_count for r in stats)
            if not n_chunks:
                return SearchResult(query, [], [])
            avgdl = max(sum(r.term_total for r in stats) / n_chunks, 1.0)
            hashes = list(term_of)
            in_scope = (KnowledgePosting.term.in_(hashes),
                        KnowledgePosting.document_id.in_(visible))
            # The database counts and sums (a common term has thousands of postings: moving
            # them into Python cost 5-10x the query); Python only sees the candidates.
            df: Counter = Counter()
            for term_hash, count in session.execute(
                    select(KnowledgePosting.term, func.count()).where(*in_scope)
                    .group_by(KnowledgePosting.term)):
                df[term_of[term_hash]] += count
            idf = {t: math.log(1 + (n_chunks - df.get(t, 0) + 0.5) / (df.get(t, 0) + 0.5))
                   for t in weights}
            unknown = tuple(w.term for w in words if not _held(w, df))

            def done(result: SearchResult) -> SearchResult:
                result.unknown = unknown
                return result

            factor = {h: idf[t] * weights[t] for h, t in term_of.items() if df.get(t)}
            if not factor:
                ranked, scores = [], {}
            else:
                tf, dl = KnowledgePosting.tf, KnowledgePosting.dl
                bm25 = func.sum(case(factor, value=KnowledgePosting.term, else_=0.0)
                                * tf * (K1 + 1) / (tf + K1 * (1 - B + B * dl / avgdl)))
                rows = session.execute(
                    select(KnowledgePosting.chunk_id, bm25.label("score"))
                    .where(KnowledgePosting.term.in_(list(factor)), in_scope[1])
                    .group_by(KnowledgePosting.chunk_id)
                    .order_by(bm25.desc(), KnowledgePosting.chunk_id)
                    .limit(max(top_k * 5, 20, self._rerank_pool()))).all()
                scores = {chunk_id: float(score) for chunk_id, score in rows}
                ranked = [chunk_id for chunk_id, _ in rows]

            def matched_in(chunk_ids) -> dict[int, set[str]]:
                """The question's terms each of these chunks holds (for coverage)."""
                found: dict[int, set[str]] = {}
                if factor and chunk_ids:
                    for term_hash, chunk_id in session.execute(
                            select(KnowledgePosting.term, KnowledgePosting.chunk_id)
                            .where(KnowledgePosting.term.in_(list(factor)),
                                   KnowledgePosting.chunk_id.in_(list(chunk_ids)))):
                        found.setdefault(chunk_id, set()).add(term_of[term_hash])
                return found

            dense = self._dense(session, query, visible, max(top_k * 5, self._rerank_pool()))
            if dense is None:
                if self.reranker is not None:
                    pool = ranked[:self._rerank_pool()]
                    matched = matched_in(pool)
                    coverage = {c: _coverage(words, idf, matched.get(c, set())) for c in pool}
                    reranked = self._reranked(query, self._passages(session, pool, scores, coverage), top_k)
                    if reranked is not None:
                        return done(reranked)
                best = ranked[:top_k]
                matched = matched_in(best)
                coverage = {c: _coverage(words, idf, matched.get(c, set())) for c in best}
                passages = self._passages(session, best, scores, coverage)
                return done(SearchResult(query, [p for p in passages if p.coverage >= threshold],
                                         passages))
            # Reciprocal rank fusion of the two rankings; a passage is relevant when either side
            # finds it so (BM25's coverage, or the cosine over KB_MIN_SIMILARITY), and the
            # relevant ones come first: a passage only the dense side ranks, however close, fuses
            # below passages BM25 alone ranks, however weak, and top_k would cut it.
            cosine = dict(dense)
            minimum = self.settings.kb_min_similarity
            fused: dict[int, float] = {}
            for weight, ranking in ((1.0, ranked[:top_k * 5]),
                                    (self.settings.kb_dense_weight, [c for c, _ in dense])):
                for rank, chunk_id in enumerate(ranking):
                    fused[chunk_id] = fused.get(chunk_id, 0.0) + weight / (RRF_K + rank + 1)
            matched = matched_in(list(fused))
            coverage = {c: _coverage(words, idf, matched.get(c, set())) for c in fused}

            def relevant(chunk_id: int) -> bool:
                return coverage[chunk_id] >= threshold or cosine.get(chunk_id, -1.0) >= minimum

            order = sorted(fused, key=lambda c: (not relevant(c), -fused[c], c))
            if self.reranker is not None:
                pool = order[:self._rerank_pool()]
                reranked = self._reranked(query, self._passages(
                    session, pool, {c: scores.get(c, 0.0) for c in pool}, coverage, cosine), top_k)
                if reranked is not None:
                    return done(reranked)
            best = order[:top_k]
            passages = self._passages(session, best, {c: scores.get(c, 0.0) for c in best},
                                      coverage, cosine)
        return done(SearchResult(query, [p for p in passages if p.coverage >= threshold
                                         or (p.similarity is not None and p.similarity >= minimum)],
                                 passages))

    def _ask(self, part: str, url: str, call, errors):
        """``call()``'s answer, or None when the ``part`` server (embeddings, rerank) fails now or
        failed less than ``KB_SERVER_RETRY_S`` ago (``app.knowledge.breaker``): logged, counted."""
        server, retry_s = f"{part} {url}", self.settings.kb_server_retry_s
        if not self.breaker.allows(server, retry_s):
            metrics.KNOWLEDGE_DEGRADED.labels(part=part).inc()
            return None
        try:
            answer = call()
        except errors as exc:
            self.breaker.failed(server, retry_s)
            log.warning("%s skipped: %s (tried again in %.0f s)", SKIPPED_WHAT[part], exc, retry_s)
            metrics.KNOWLEDGE_DEGRADED.labels(part=part).inc()
            return None
        self.breaker.succeeded(server)
        return answer

    def _rerank_pool(self) -> int:
        return self.settings.rerank_candidates if self.reranker is not None else 0

    def _reranked(self, query: str, pool: list[Passage], top_k: int) -> SearchResult | None:
        """The pool ordered by the reranker's scores, relevant from ``KB_MIN_RELEVANCE``; None
        when the reranker fails (the thresholds decide then, and the log says so)."""
        documents = [f"{p.section}\n{p.text}" if p.section else p.text for p in pool]
        relevance = self._ask("rerank", self.reranker.url, lambda: self.reranker.scores(query, documents),
                              RerankError)
        if relevance is None:
            return None
        for passage, score in zip(pool, relevance, strict=True):
            passage.relevance = score
        best = sorted(pool, key=lambda p: -p.relevance)[:top_k]  # stable: fused order breaks ties
        minimum = self.settings.kb_min_relevance
        return SearchResult(query, [p for p in best if p.relevance >= minimum], best)

    def _dense(self, session, query: str, visible, limit: int) -> list[tuple[int, float]] | None:
        """The dense ranking, or None without an embeddings server (or when it fails: BM25
        alone answers then, and the log says so)."""
        if self.embedder is None:
            return None
        vectors = self._ask("embeddings", self.embedder.url, lambda: self.embedder.embed([query]),
                            EmbeddingError)
        if vectors is None:
            return None
        [vector] = vectors
        ids = set(session.scalars(visible))
        return self.vectors.search(session, vector, ids, limit)

    def _passages(self, session, chunk_ids, scores, coverage, cosine=None) -> list[Passage]:
        if not chunk_ids:
            return []
        rows = session.execute(
            select(KnowledgeChunk.id, KnowledgeChunk.document_id, KnowledgeChunk.section_enc,
                   KnowledgeChunk.text_enc, KnowledgeDocument.title_enc)
            .join(KnowledgeDocument, KnowledgeDocument.id == KnowledgeChunk.document_id)
            .where(KnowledgeChunk.id.in_(chunk_ids))).all()
        by_id = {r.id: r for r in rows}
        out = []
        for chunk_id in chunk_ids:
            r = by_id.get(chunk_id)
            if r is None:  # removed between the two reads (PostgreSQL read committed)
                continue
            out.append(Passage(
                chunk_id=chunk_id, document_id=r.document_id,
                title=self.cipher.decrypt(r.title_enc, "kb_documents", "title_enc", r.document_id),
                section=self.cipher.decrypt(r.section_enc, "kb_chunks", "section_enc", chunk_id),
                text=self.cipher.decrypt(r.text_enc, "kb_chunks", "text_enc", chunk_id),
                score=scores[chunk_id],
                coverage=coverage[chunk_id],
                similarity=None if cosine is None else cosine.get(chunk_id)))
        return out


def score_texts(question: str, texts: list[str]) -> list[tuple[float, float]]:
    """(BM25, coverage) of each of ``texts`` for ``question``: the same terms, weights and
    coverage as a search of the knowledge base, with ``texts`` alone as the collection (the
    paragraphs of a file the employee sent, which are never indexed)."""
    counts = Counter(terms(question))
    if not counts or not texts:
        return [(0.0, 0.0)] * len(texts)
    weights = {t: BIGRAM_WEIGHT if t.startswith("~") else 1.0 for t in counts}
    table = equivalents()
    for word in [t for t in counts if not t.startswith("~")]:
        for alt in table.get(word, ()):
            for term in alt:
                weights.setdefault(term, GLOSSARY_WEIGHT)
    words = _coverage_words(counts)
    documents = [Counter(terms(text)) for text in texts]
    n = len(documents)
    avgdl = max(sum(sum(d.values()) for d in documents) / n, 1.0)
    df = Counter(t for d in documents for t in weights if d.get(t))
    idf = {t: math.log(1 + (n - df.get(t, 0) + 0.5) / (df.get(t, 0) + 0.5)) for t in weights}
    scored = []
    for document in documents:
        dl = sum(document.values())
        matched = {t for t in weights if document.get(t)}
        bm25 = sum(idf[t] * weights[t] * document[t] * (K1 + 1)
                   / (document[t] + K1 * (1 - B + B * dl / avgdl)) for t in matched)
        scored.append((bm25, _coverage(words, idf, matched)))
    return scored
